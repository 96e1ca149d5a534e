"""The CPU paged-decode attention kernel (csrc/paged_decode_cpu.cpp), compiled on first use.

torch's C++ extension builder compiles it once per machine (about 40 s) into
``~/.cache/torch_extensions`` (or ``TORCH_EXTENSIONS_DIR``); later processes load the cached build.
When there is no C++ compiler, the build fails once with a warning and callers fall back.
"""
from __future__ import annotations

import functools
import warnings
from pathlib import Path

import torch

_SOURCE = Path(__file__).parent / "csrc" / "paged_decode_cpu.cpp"


@functools.cache
def _module():
    from torch.utils.cpp_extension import load

    try:
        return load(name="sarathi_paged_decode_cpu", sources=[str(_SOURCE)],
                    extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"])
    except Exception as e:  # noqa: BLE001 - any build failure means: use the fallback
        warnings.warn(f"the CPU paged-decode kernel did not build ({type(e).__name__}: {e}); "
                      "decode attention falls back to torch's flash kernel", stacklevel=2)
        return None


def available() -> bool:
    return _module() is not None


def paged_decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """[n, heads, d] float32 queries, one per request, against their ``seq_lens`` cached tokens."""
    return _module().paged_decode(query.contiguous(), k_cache, v_cache, block_tables, seq_lens, scale)
