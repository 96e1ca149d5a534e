"""The engine's attention kernel timed beside peers on the same values and beside its floor: SDPA
(flash, cuDNN where present) and FlexAttention over contiguous keys and values. Each contender is
first held to ``attention/reference.py`` in float32 (one that disagrees or fails is not timed
there); calls interleave, each after an L2 flush, so drifts fall on every contender alike."""
from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from sarathi_kernels.tolerances import COMPILED_TOLERANCE as TOLERANCE
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from sarathi_lab.attention import AttentionMetadata, reference
from sarathi_lab.engine.timer import time_interleaved
from sarathi_lab.measure.profiling.attention import context_slot_mapping, paged_batch, paged_cache
from sarathi_lab.measure.profiling.attention_grid import CUDNN, ENGINE, FLEX, SDPA, Case
from sarathi_lab.model.floors import attention_floor


@dataclass
class Inputs:
    query: torch.Tensor  # [tokens, heads, head_dim]: the engine's layout
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    meta: AttentionMetadata
    q: torch.Tensor  # [batch, heads, query_len, head_dim]: the peers' layout
    k: torch.Tensor
    v: torch.Tensor
    scale: float


def make_inputs(case: Case, dtype: torch.dtype, device: torch.device, block_size: int) -> Inputs:
    """Unused cache slots are NaN, so that a kernel reading outside its tables shows."""
    gen = torch.Generator(device).manual_seed(0)
    b, h, kvh, d = case.batch, case.heads, case.kv_heads, case.head_dim
    n, ctx = case.query_len, case.context
    q = torch.randn(b, n, h, d, generator=gen, device=device).to(dtype)
    k, v = (torch.randn(b, ctx, kvh, d, generator=gen, device=device).to(dtype) for _ in range(2))
    meta, num_blocks = paged_batch(case.query_lens, case.context_lens, num_prefills=0
                                   if case.kind == "decode" else b, block_size=block_size,
                                   device=device)
    slots = context_slot_mapping(meta, block_size)
    k_cache, v_cache = (paged_cache(x.flatten(0, 1), slots, num_blocks, block_size) for x in (k, v))
    return Inputs(q.flatten(0, 1), k_cache, v_cache, meta, q.transpose(1, 2).contiguous(),
                  k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous(), d ** -0.5)


def engine_call(x: Inputs, planned: bool = False, **launch) -> Callable[[], torch.Tensor]:
    """``planned``: planned as the engine runs a batch, once, outside the timed call."""
    from sarathi_kernels.attention_plan import plan_batch
    from sarathi_kernels.occupancy import device_limits
    from sarathi_kernels.paged_attention import paged_attention

    out = torch.empty_like(x.query)
    m = x.meta
    if planned:
        launch = {"plan": plan_batch(m.query_lens_host, m.seq_lens_host, x.query.shape[1],
                                     x.k_cache.shape[2], num_prefills=m.num_prefills,
                                     element_size=x.query.element_size(),
                                     limits=device_limits(x.query.device))}
    return lambda: paged_attention(x.query, x.k_cache, x.v_cache, m.query_start_loc, m.seq_lens,
                                   m.block_tables, x.scale, max_query_len=m.max_query_len, out=out,
                                   **launch)


def cudnn_available(device: torch.device) -> bool:
    """Hopper (compute capability 9.0) with cuDNN in this torch."""
    return (device.type == "cuda" and torch.backends.cudnn.is_available()
            and torch.cuda.get_device_capability(device) >= (9, 0))


def sdpa_call(case: Case, x: Inputs, backend: SDPBackend | None) -> Callable[[], torch.Tensor]:
    """Bottom-right causal as a boolean mask for cuDNN: CausalBias would hand it to flash anyway."""
    gqa = case.heads != case.kv_heads
    mask = None
    if case.kind == "chunk" and case.prefix:
        mask = causal_lower_right(case.query_len, case.context)
        if backend == SDPBackend.CUDNN_ATTENTION:
            ones = torch.ones(case.query_len, case.context, dtype=torch.bool, device=x.q.device)
            mask = ones.tril(diagonal=case.prefix)
    causal = case.kind != "decode" and mask is None

    def call() -> torch.Tensor:
        with sdpa_kernel(backend) if backend is not None else nullcontext():
            return F.scaled_dot_product_attention(x.q, x.k, x.v, attn_mask=mask, is_causal=causal,
                                                  scale=x.scale, enable_gqa=gqa)
    return call


class Flex:
    """Compiled once per process, one kernel per shape; eager without a Triton target."""

    def __init__(self, compiled: bool):
        self.compiled = compiled
        self.fn = torch.compile(flex_attention, dynamic=False) if compiled else flex_attention

    def call(self, case: Case, x: Inputs) -> Callable[[], torch.Tensor]:
        prefix = case.prefix

        def bottom_right_causal(b, h, q_idx, kv_idx):
            return q_idx + prefix >= kv_idx

        mask = create_block_mask(bottom_right_causal, None, None, case.query_len, case.context,
                                 device=x.q.device)
        gqa = case.heads != case.kv_heads

        def call() -> torch.Tensor:
            return self.fn(x.q, x.k, x.v, block_mask=mask, scale=x.scale, enable_gqa=gqa)

        def eager() -> torch.Tensor:
            with warnings.catch_warnings():
                # Eager FlexAttention warns on every call that it is not compiled: on purpose here.
                warnings.simplefilter("ignore", UserWarning)
                return call()
        return call if self.compiled else eager


def rel_diff(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).abs().max() / ref.abs().max()).item()


def measure(case: Case, *, dtype: torch.dtype, device: torch.device, block_size: int, reps: int,
            warmup: int, flex: Flex | None, copy_gbps: float, matmul_gflops: float) -> dict:
    """Each contender's median ms (None where it failed or disagreed: ``<name>_error`` says why)."""
    x = make_inputs(case, dtype, device, block_size)
    flash = device.type == "cuda"
    builders = {ENGINE: lambda: engine_call(x, planned=True),
                SDPA: lambda: sdpa_call(case, x, SDPBackend.FLASH_ATTENTION if flash else None)}
    if cudnn_available(device):
        builders[CUDNN] = lambda: sdpa_call(case, x, SDPBackend.CUDNN_ATTENTION)
    if flex is not None:
        builders[FLEX] = lambda: flex.call(case, x)
    peers = [p for p in case.peers if p in builders]
    row: dict = {"shape": case.label, "kind": case.kind, "heads": case.heads,
                 "kv_heads": case.kv_heads, "head_dim": case.head_dim, "batch": case.batch,
                 "query_len": case.query_len, "context": case.context,
                 "dtype": str(dtype).removeprefix("torch."), "device": device.type,
                 "sdpa_backend": "flash" if flash else "default (no flash backend off CUDA)",
                 "flex_compiled": flex is not None and flex.compiled,
                 "peers_not_available": " ".join(p for p in case.peers if p not in builders)}
    time_checked(builders, (ENGINE, *peers), x, row, device, reps, warmup, peers)
    least = attention_floor(case.heads, case.kv_heads, case.head_dim, case.query_lens,
                            case.context_lens, dtype.itemsize, copy_gbps, matmul_gflops)
    row |= {"floor_ms": least.seconds * 1e3, "floor_bound": least.bound, "flops": least.flops,
            "bytes": least.bytes}
    best = min((row[f"{p}_ms"] for p in peers if row[f"{p}_ms"] is not None), default=None)
    engine = row[f"{ENGINE}_ms"]
    return row | {"best_peer_ms": best,
                  "over_best_peer": engine / best if engine is not None and best else None,
                  "over_floor": engine / row["floor_ms"] if engine is not None else None,
                  "max_rel_diff": max((row[k] for k in row if k.endswith("_rel_diff")),
                                      default=None)}


def time_checked(builders: dict[str, Callable], names, x: Inputs, row: dict, device: torch.device,
                 reps: int, warmup: int, peer_layout=()) -> None:
    """First calls timed (FlexAttention's compile) and checked, those in ``peer_layout`` as engine
    rows; the rest timed interleaved."""
    ref = reference.attention(x.query.float(), x.k_cache.float(), x.v_cache.float(), x.meta,
                              x.scale)
    tolerance, calls = TOLERANCE[x.query.dtype], {}
    for name in names:
        if name not in builders:
            row[f"{name}_error"] = "not available"
            continue
        try:
            fn = builders[name]()
            started = time.perf_counter()
            out = fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            row[f"{name}_first_call_s"] = time.perf_counter() - started
            out = out.transpose(1, 2).flatten(0, 1) if name in peer_layout else out
        except Exception as e:  # noqa: BLE001 - a contender that cannot run this shape is a finding
            first = (str(e).strip().splitlines() or [""])[0]
            row[f"{name}_error"] = f"{type(e).__name__}: {first}"[:300]
            continue
        row[f"{name}_rel_diff"] = diff = rel_diff(out, ref)
        if not diff <= tolerance:
            row[f"{name}_error"] = (f"differs from the reference by {diff:.2e} "
                                    f"(tolerance {tolerance:.0e})")
            continue
        calls[name] = fn
    del ref
    times = time_interleaved(calls, reps, device, warmup) if calls else {}
    for name in names:
        row[f"{name}_ms"] = statistics.median(times[name]) if name in times else None
