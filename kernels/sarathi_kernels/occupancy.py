"""How many programs of the paged attention kernel an SM holds at once (its resident CTAs), from the
compiled kernel's registers and shared memory and the GPU's limits: the unit of a "wave" that the split
rule (split_rule.py) fills. Pure arithmetic: no GPU needed.

The kernels' resources are those of their sm_90 compile (Triton, bf16, head_dim 128, Triton's default
3 stages), as ptxas reports them; tests/test_attention_plan.py recompiles every tabulated variant
through ptxas and fails where this table has drifted from the compiler."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GpuLimits:
    """What bounds the programs resident on one SM, and how many SMs there are."""

    num_sms: int
    registers_per_sm: int = 65536
    shared_bytes_per_sm: int = 228 * 1024
    max_warps_per_sm: int = 64
    max_ctas_per_sm: int = 32


# The GPUs the suite plans for. H100 SXM and H200 share the SM (sm_90, 228 KB shared memory a SM).
H100 = GpuLimits(num_sms=132)
H200 = GpuLimits(num_sms=132)
A100 = GpuLimits(num_sms=108, shared_bytes_per_sm=164 * 1024)

# The driver keeps this much of an SM's shared memory per resident CTA (sm_80 on).
RESERVED_SHARED_PER_CTA = 1024
# Registers are allocated per warp in units of 256 (8 per thread), from one of the SM's four
# partitions: a warp cannot take registers from two.
REGISTER_UNIT = 256
PARTITIONS = 4


@dataclass(frozen=True)
class KernelResources:
    registers: int  # per thread
    shared_bytes: int  # per CTA
    num_warps: int


# (work kind, block_m, num_warps) -> the sm_90 compile's resources. "decode": one token a request,
# decode tiles; "prefill": query tiles of block_m rows.
SM90_RESOURCES: dict[tuple[str, int, int], KernelResources] = {
    ("decode", 16, 4): KernelResources(146, 39424, 4),
    ("prefill", 64, 4): KernelResources(196, 82944, 4),
    ("prefill", 128, 8): KernelResources(192, 98816, 8),
}


def kernel_resources(kind: str, block_m: int, num_warps: int) -> KernelResources:
    """The tabulated compile of this variant; an untabulated one (a tuned table's) is taken as the
    tabulated variant of its kind nearest in rows, on its own warps: an estimate until it is compiled."""
    if (kind, block_m, num_warps) in SM90_RESOURCES:
        return SM90_RESOURCES[kind, block_m, num_warps]
    near = min((key for key in SM90_RESOURCES if key[0] == kind), key=lambda key: abs(key[1] - block_m))
    found = SM90_RESOURCES[near]
    return KernelResources(found.registers, found.shared_bytes, num_warps)


def resident_ctas(resources: KernelResources, limits: GpuLimits) -> int:
    """CTAs of this kernel one SM holds at once (the CUDA occupancy calculator's arithmetic)."""
    per_warp = -(-resources.registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
    warps_by_registers = PARTITIONS * ((limits.registers_per_sm // PARTITIONS) // per_warp)
    by_registers = warps_by_registers // resources.num_warps
    by_shared = limits.shared_bytes_per_sm // (resources.shared_bytes + RESERVED_SHARED_PER_CTA)
    by_warps = limits.max_warps_per_sm // resources.num_warps
    return max(1, min(by_registers, by_shared, by_warps, limits.max_ctas_per_sm))


_LIMITS: dict[int, GpuLimits] = {}


def device_limits(device: torch.device) -> GpuLimits | None:
    """The limits of a CUDA device (asked once per device); None elsewhere (the interpreter: no split)."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _LIMITS:
        props = torch.cuda.get_device_properties(index)
        _LIMITS[index] = GpuLimits(
            num_sms=props.multi_processor_count,
            registers_per_sm=getattr(props, "regs_per_multiprocessor", GpuLimits.registers_per_sm),
            shared_bytes_per_sm=getattr(props, "shared_memory_per_multiprocessor", GpuLimits.shared_bytes_per_sm),
            max_warps_per_sm=getattr(props, "max_threads_per_multi_processor", 2048) // 32)
    return _LIMITS[index]


def device_sm_count(device: torch.device) -> int | None:
    """The SMs of a CUDA device; None elsewhere (the interpreter plans no split)."""
    limits = device_limits(device)
    return limits.num_sms if limits is not None else None
