"""Scatter one step's keys and values into their paged-cache slots.

Program (token tile, kv_head) moves a [BLOCK_T, head_dim] tile; the slot of each token comes from
``slot_mapping`` (block * block_size + offset), so tokens of one request may land in scattered
physical blocks.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sarathi_kernels._checks import (
    FLOAT_DTYPES,
    padded_head_dim,
    require,
    require_dim,
    require_int,
    require_same_device,
    require_unit_last_stride,
)
from sarathi_kernels.triton_jit import jit


@jit(do_not_specialize=("num_tokens",))
def _write_kv_kernel(key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, num_tokens, head_dim,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
                     BLOCK_SIZE: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_T: tl.constexpr):
    head = tl.program_id(1)
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    tok_ok = tok < num_tokens
    slot = tl.load(slot_ptr + tok, mask=tok_ok, other=-1)
    # A negative slot is a padded token (a CUDA graph's batch larger than the real one): not stored.
    tok_ok = tok_ok & (slot >= 0)
    block = slot // BLOCK_SIZE
    within = slot % BLOCK_SIZE
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    ok = tok_ok[:, None] & (offs_d < head_dim)[None, :]
    src_t = tok.to(tl.int64)[:, None]
    key = tl.load(key_ptr + src_t * stride_kt + head * stride_kh + offs_d[None, :], mask=ok)
    value = tl.load(value_ptr + src_t * stride_vt + head * stride_vh + offs_d[None, :], mask=ok)
    k_dst = (block * stride_kcb + within * stride_kcs + head * stride_kch)[:, None] + offs_d[None, :]
    v_dst = (block * stride_vcb + within * stride_vcs + head * stride_vch)[:, None] + offs_d[None, :]
    tl.store(k_cache_ptr + k_dst, key, mask=ok)
    tl.store(v_cache_ptr + v_dst, value, mask=ok)


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor, *, block_t: int = 16) -> None:
    """key/value [T, kv_heads, head_dim] -> cache slots ``slot_mapping`` (int64 [T]), in place.

    Slots are trusted (no device sync to check them); each must lie inside the cache, or be negative:
    that token is skipped (a padded one).
    """
    require_dim("key", key, 3, "[tokens, kv_heads, head_dim]")
    require(value.shape == key.shape, f"value shape {tuple(value.shape)} differs from key shape {tuple(key.shape)}")
    require_dim("k_cache", k_cache, 4, "[num_blocks, block_size, kv_heads, head_dim]")
    require(v_cache.shape == k_cache.shape,
            f"v_cache shape {tuple(v_cache.shape)} differs from k_cache shape {tuple(k_cache.shape)}")
    require(key.shape[1:] == k_cache.shape[2:],
            f"key [tokens, kv_heads, head_dim] = {tuple(key.shape)} does not fit cache {tuple(k_cache.shape)}")
    require(key.dtype in FLOAT_DTYPES, f"key dtype must be one of float16/bfloat16/float32, got {key.dtype}")
    require(value.dtype == key.dtype and k_cache.dtype == key.dtype and v_cache.dtype == key.dtype,
            f"key, value and caches must share a dtype, got {key.dtype}, {value.dtype}, "
            f"{k_cache.dtype}, {v_cache.dtype}")
    require_int("slot_mapping", slot_mapping, torch.int64, 1)
    require(slot_mapping.shape[0] == key.shape[0],
            f"slot_mapping has {slot_mapping.shape[0]} slots for {key.shape[0]} tokens")
    for name, t in (("key", key), ("value", value), ("k_cache", k_cache), ("v_cache", v_cache)):
        require_unit_last_stride(name, t)
    require_same_device(key=key, value=value, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    require(block_t > 0 and block_t & (block_t - 1) == 0, f"block_t must be a power of two, got {block_t}")
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    grid = (triton.cdiv(num_tokens, block_t), num_kv_heads)
    _write_kv_kernel[grid](
        key, value, k_cache, v_cache, slot_mapping, num_tokens, head_dim,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        BLOCK_SIZE=k_cache.shape[1], HEAD_DIM_PAD=padded_head_dim(head_dim), BLOCK_T=block_t,
    )
