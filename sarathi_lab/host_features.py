"""What this host can run, probed once. Layer 0 (no lab imports): configs validate against it."""
from __future__ import annotations

import functools
import os


def usable_cores() -> int:
    """Its affinity, not the machine's count."""
    return len(os.sched_getaffinity(0))


@functools.cache
def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@functools.cache
def cpu_has_bf16_units() -> bool:
    import torch

    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def resolve_device(device: str) -> str:
    """``auto``: CUDA where this host has it."""
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    return device


def run_dtype(dtype: str, device_type: str) -> str:
    """bfloat16 without bf16 matrix units runs as float32: it would distort every cost ratio."""
    bf16_on_cpu = dtype == "bfloat16" and device_type == "cpu"
    return "float32" if bf16_on_cpu and not cpu_has_bf16_units() else dtype


@functools.cache
def cpu_has_onednn_fp16() -> bool:
    """oneDNN's float16 packed linear, tried once: torch has no flag for it."""
    import torch

    try:
        weight = torch.ops.mkldnn._reorder_linear_weight(torch.ones(8, 8, dtype=torch.float16), 8)
        torch.ops.mkldnn._linear_pointwise(torch.ones(2, 8, dtype=torch.float16), weight, None,
                                           "none", [], "")

    except (RuntimeError, AttributeError):
        return False
    return True
