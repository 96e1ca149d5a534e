"""The CPU attention kernels over the paged KV cache, float32 or bfloat16 storage:
``paged_decode`` (csrc/paged_decode_cpu.cpp, one query per request) and ``paged_prefill``
(csrc/paged_prefill_cpu.cpp, every prefill chunk of an iteration, causal from the bottom right);
and ``write_kv`` (csrc/kv_write_cpu.cpp), this step's keys and values into their cache slots.

Built with the other CPU kernels by ``cpu_build``; where they cannot be built, ``available()`` is
False and the attention backend uses torch's ``scaled_dot_product_attention`` instead.
Values (lengths, block ids, offsets) are trusted, as the engine built them; layouts, dtypes and
shapes are checked, because a wrong one would read out of bounds rather than raise. The checks are
cheap attribute reads: these run in every layer. ``write_kv`` also checks each slot (in C++) before
writing anything: a wrong slot would write out of bounds.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from sarathi_kernels import cpu_build
from sarathi_kernels.cpu_ops import DTYPES  # one library, one suffix per dtype

_PTR, _I64 = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {
    "paged_decode": [_PTR, _I64] + [_PTR] * 5 + [_I64] * 6 + [ctypes.c_float, ctypes.c_int],
    "paged_prefill": [_PTR, _I64] + [_PTR] * 6 + [_I64] * 6 + [ctypes.c_float, ctypes.c_int],
}


@functools.cache
def _kernel(name: str, suffix: str):
    return cpu_build.function(f"{name}_{suffix}", _SIGNATURES[name])


@functools.cache
def _kv_write():
    return cpu_build.function("kv_write", [_PTR, _I64, _PTR, _I64, _PTR, _PTR, _PTR, _I64, _I64, _I64, ctypes.c_int],
                              _I64)


def available() -> bool:
    return cpu_build.library() is not None


def _check(what: str, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
           lens: torch.Tensor, n: int) -> None:
    """query [tokens, heads, d] with contiguous heads; caches [blocks, block_size, kv_heads, d]."""
    _, heads, d = query.shape
    _, _, kv_heads, cache_d = k_cache.shape
    if not (query.dtype == k_cache.dtype == v_cache.dtype and query.dtype in DTYPES and query.is_cpu
            and k_cache.is_cpu and v_cache.is_cpu and k_cache.is_contiguous() and v_cache.is_contiguous()
            and query.stride(2) == 1 and query.stride(1) == d):
        raise ValueError(f"{what}: float32 or bfloat16 CPU tensors of one dtype, with contiguous caches and "
                         "query heads only")
    if not (v_cache.shape == k_cache.shape and cache_d == d and heads % kv_heads == 0 and len(tables) == n
            and lens.shape == (n,) and tables.dtype == lens.dtype == torch.int32 and tables.is_cpu and lens.is_cpu
            and tables.is_contiguous() and lens.is_contiguous()):
        raise ValueError(f"{what}: query {tuple(query.shape)}, caches {tuple(k_cache.shape)}, int32 tables "
                         f"{tuple(tables.shape)} and lens {tuple(lens.shape)} do not fit")


def _output(what: str, out: torch.Tensor | None, query: torch.Tensor) -> torch.Tensor:
    if out is None:
        return torch.empty(query.shape, dtype=query.dtype)
    if not (out.shape == query.shape and out.dtype == query.dtype and out.is_cpu and out.is_contiguous()):
        raise ValueError(f"{what}: out must be a contiguous CPU {tuple(query.shape)} {query.dtype}")
    return out


def paged_decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """[n, heads, d] queries, one per request, against their ``seq_lens`` cached tokens, written
    into ``out`` (a new tensor if None).

    query [n, heads, d], rows may be strided (q inside the fused qkv output; other layouts are copied);
    k_cache/v_cache [blocks, block_size, kv_heads, d]: one dtype of ``DTYPES``, CPU, caches
    contiguous; block_tables int32 [n, max_blocks]; seq_lens int32 [n].
    """
    n, heads, d = query.shape
    if not (query.stride(2) == 1 and query.stride(1) == d):
        query = query.contiguous()
    tables, lens = block_tables.contiguous(), seq_lens.contiguous()
    _check("paged_decode", query, k_cache, v_cache, tables, lens, n)
    out = _output("paged_decode", out, query)
    _kernel("paged_decode", DTYPES[query.dtype])(
        query.data_ptr(), query.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), lens.data_ptr(),
        out.data_ptr(), n, heads, d, k_cache.shape[1], k_cache.shape[2], tables.shape[1], scale,
        torch.get_num_threads())
    return out


def paged_prefill(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                  query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of n prefill chunks, written into ``out`` [tokens, heads, d] (a new tensor if None).

    query [tokens, heads, d]: chunk i's rows are query_start_loc[i]:query_start_loc[i + 1], the last
    of its seq_lens[i] tokens, whose keys and values are already in the cache; rows may be strided
    (q inside the fused qkv output), heads contiguous. query_start_loc int32 [n + 1] starting at 0;
    block_tables int32 [n, max_blocks]; seq_lens int32 [n].
    """
    _, heads, d = query.shape
    n = len(seq_lens)
    _check("paged_prefill", query, k_cache, v_cache, block_tables, seq_lens, n)
    if not (query_start_loc.shape == (n + 1,) and query_start_loc.dtype == torch.int32 and query_start_loc.is_cpu
            and query_start_loc.is_contiguous()):
        raise ValueError(f"paged_prefill: query_start_loc must be a contiguous CPU int32 [{n + 1}]; got "
                         f"{tuple(query_start_loc.shape)} {query_start_loc.dtype}")
    out = _output("paged_prefill", out, query)
    _kernel("paged_prefill", DTYPES[query.dtype])(
        query.data_ptr(), query.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
        query_start_loc.data_ptr(), seq_lens.data_ptr(), out.data_ptr(), n, heads, d, k_cache.shape[1],
        k_cache.shape[2], block_tables.shape[1], scale, torch.get_num_threads())
    return out


def write_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """attention/reference.write_kv's index_copy_ as one C++ call: key/value [T, kv_heads, d] (rows may
    be strided, heads contiguous: views into the fused qkv output) into caches [blocks, block_size,
    kv_heads, d] (contiguous, CPU, the keys' dtype) at int64 slot_mapping [T] (block * block_size +
    offset, each checked against the cache's slots before anything is written)."""
    tokens, kv_heads, d = key.shape
    blocks, block_size = k_cache.shape[:2]
    if not (value.shape == key.shape and k_cache.shape == v_cache.shape == (blocks, block_size, kv_heads, d)
            and key.dtype == value.dtype == k_cache.dtype == v_cache.dtype and key.is_cpu and value.is_cpu
            and k_cache.is_cpu and v_cache.is_cpu and k_cache.is_contiguous() and v_cache.is_contiguous()
            and all(t.stride(2) == 1 and t.stride(1) == d for t in (key, value))
            and slot_mapping.shape == (tokens,) and slot_mapping.dtype == torch.int64 and slot_mapping.is_cpu
            and slot_mapping.is_contiguous()):
        raise ValueError(f"write_kv: keys/values {tuple(key.shape)} {key.dtype} with contiguous heads, CPU caches "
                         f"{tuple(k_cache.shape)} of their dtype and an int64 CPU slot_mapping [{tokens}] are needed; "
                         f"got values {tuple(value.shape)}, caches {tuple(k_cache.shape)} {k_cache.dtype}, "
                         "slot_mapping "
                         f"{tuple(slot_mapping.shape)} {slot_mapping.dtype}")
    size = key.element_size()
    bad = _kv_write()(key.data_ptr(), key.stride(0) * size, value.data_ptr(), value.stride(0) * size,
                      k_cache.data_ptr(), v_cache.data_ptr(), slot_mapping.data_ptr(), tokens, kv_heads * d * size,
                      blocks * block_size, torch.get_num_threads())
    if bad >= 0:
        raise IndexError(f"write_kv: slot_mapping[{bad}] = {int(slot_mapping[bad])} is outside the cache's "
                         f"{blocks * block_size} slots")
