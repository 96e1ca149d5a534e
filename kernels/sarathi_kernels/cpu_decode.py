"""The CPU paged-decode attention kernel (csrc/paged_decode_cpu.cpp), float32 or bfloat16 storage.

Built with the other CPU kernels by ``cpu_build``; where they cannot be built, ``available()`` is
False and the attention backend uses torch's ``scaled_dot_product_attention`` instead.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from sarathi_kernels import cpu_build

DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}
_PTR, _I64 = ctypes.c_void_p, ctypes.c_int64


@functools.cache
def _kernel(suffix: str):
    return cpu_build.function(f"paged_decode_{suffix}", [_PTR] * 6 + [_I64] * 6 + [ctypes.c_float, ctypes.c_int])


def available() -> bool:
    return cpu_build.library() is not None


def paged_decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """[n, heads, d] queries, one per request, against their ``seq_lens`` cached tokens.

    query, k_cache/v_cache [blocks, block_size, kv_heads, d]: one dtype of ``DTYPES``, CPU, caches
    contiguous; block_tables int32 [n, max_blocks]; seq_lens int32 [n]. Values (lengths, block ids)
    are trusted, as the engine built them.
    """
    query, tables, lens = query.contiguous(), block_tables.contiguous(), seq_lens.contiguous()
    n, heads, d = query.shape
    _, block_size, kv_heads, cache_d = k_cache.shape
    # Checked because a wrong layout would read out of bounds, not raise; kept to cheap attribute
    # reads, as this runs in every layer.
    if not (query.dtype == k_cache.dtype == v_cache.dtype and query.dtype in DTYPES and query.is_cpu
            and k_cache.is_cpu and v_cache.is_cpu and k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("paged_decode: float32 or bfloat16 CPU tensors of one dtype, with contiguous caches only")
    if not (v_cache.shape == k_cache.shape and cache_d == d and heads % kv_heads == 0 and len(tables) == n
            and lens.shape == (n,) and tables.dtype == lens.dtype == torch.int32 and tables.is_cpu and lens.is_cpu):
        raise ValueError(f"paged_decode: query {tuple(query.shape)}, caches {tuple(k_cache.shape)}, int32 tables "
                         f"{tuple(tables.shape)} and lens {tuple(lens.shape)} do not fit")
    out = torch.empty_like(query)
    _kernel(DTYPES[query.dtype])(query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
                                 lens.data_ptr(), out.data_ptr(), n, heads, d, block_size, kv_heads,
                                 tables.shape[1], scale, torch.get_num_threads())
    return out
