"""RoPE and the KV-cache write of one layer in one launch: program t rotates token t's query heads in
place inside the fused qkv output (optionally times the softmax scale), rotates its key heads and
stores them, with its value heads, straight into their paged-cache slots.

Unfused this is two launches (``pointwise.rope_`` then ``kv_cache.write_kv_cache``), and the keys make
a round trip through memory between them: rotated, stored into qkv, read back for the cache. Here the
rotated keys go to the cache only; the key columns of qkv are left as they were (attention reads keys
from the cache). Rotation rounds where ``pointwise.rope_`` and transformers round.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sarathi_kernels._checks import FLOAT_DTYPES, require, require_int, require_same_device
from sarathi_kernels.pointwise import ROPE_OPTIONS
from sarathi_kernels.triton_jit import jit


@jit
def _rotate(x1, x2, c, s):
    """(x1, x2) halves rotated by (cos, sin), each product rounded to x's dtype before the sum."""
    dt = x1.dtype
    c, s = c.to(dt).to(tl.float32), s.to(dt).to(tl.float32)
    a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
    out1 = ((a1 * c).to(dt).to(tl.float32) + (-a2 * s).to(dt).to(tl.float32)).to(dt)
    out2 = ((a2 * c).to(dt).to(tl.float32) + (a1 * s).to(dt).to(tl.float32)).to(dt)
    return out1, out2


@jit(do_not_specialize=("num_tokens",))
def _rope_write_kv_kernel(qkv_ptr, pos_ptr, cos_ptr, sin_ptr, slot_ptr, k_cache_ptr, v_cache_ptr, q_scale,
                          num_heads, num_kv_heads, stride_t, stride_kcb, stride_kcs, stride_kch,
                          stride_vcb, stride_vcs, stride_vch,
                          HALF: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_HQ: tl.constexpr,
                          BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr, SCALED: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)[None, :]
    d_ok = d < HALF
    pos = tl.load(pos_ptr + tok)
    # The tables are float32, cast to the tensor's dtype before use, as the torch code casts them.
    c = tl.load(cos_ptr + pos * 2 * HALF + d, mask=d_ok, other=0.0)
    s = tl.load(sin_ptr + pos * 2 * HALF + d, mask=d_ok, other=0.0)
    row = qkv_ptr + tok * stride_t

    hq = tl.arange(0, BLOCK_HQ)[:, None]
    q_ok = (hq < num_heads) & d_ok
    q_first = row + hq * 2 * HALF + d
    q1, q2 = _rotate(tl.load(q_first, mask=q_ok, other=0.0), tl.load(q_first + HALF, mask=q_ok, other=0.0), c, s)
    if SCALED:
        # As torch's ``q * scale``: the rounded rotation times the scale, rounded once more.
        q1 = (q1.to(tl.float32) * q_scale).to(q1.dtype)
        q2 = (q2.to(tl.float32) * q_scale).to(q2.dtype)
    tl.store(q_first, q1, mask=q_ok)
    tl.store(q_first + HALF, q2, mask=q_ok)

    slot = tl.load(slot_ptr + tok)
    # A negative slot is a padded token (a CUDA graph's batch larger than the real one): not stored.
    if slot >= 0:
        block = slot // BLOCK_SIZE
        within = slot % BLOCK_SIZE
        hk = tl.arange(0, BLOCK_HK)[:, None]
        kv_ok = (hk < num_kv_heads) & d_ok
        k_first = row + (num_heads + hk) * 2 * HALF + d
        k1, k2 = _rotate(tl.load(k_first, mask=kv_ok, other=0.0), tl.load(k_first + HALF, mask=kv_ok, other=0.0),
                         c, s)
        k_dst = k_cache_ptr + block * stride_kcb + within * stride_kcs + hk * stride_kch + d
        tl.store(k_dst, k1, mask=kv_ok)
        tl.store(k_dst + HALF, k2, mask=kv_ok)
        v_first = row + (num_heads + num_kv_heads + hk) * 2 * HALF + d
        v_dst = v_cache_ptr + block * stride_vcb + within * stride_vcs + hk * stride_vch + d
        tl.store(v_dst, tl.load(v_first, mask=kv_ok, other=0.0), mask=kv_ok)
        tl.store(v_dst + HALF, tl.load(v_first + HALF, mask=kv_ok, other=0.0), mask=kv_ok)


def rope_write_kv(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor, num_heads: int,
                  num_kv_heads: int, *, q_scale: float | None = None) -> torch.Tensor:
    """qkv [tokens, (num_heads + 2 * num_kv_heads) * head_dim] (the fused projection's output, rows
    may be strided): its query heads rotated in place by the angles of ``positions`` (int64 [tokens];
    float32 tables cos, sin [max_positions, head_dim], transformers' layout) and multiplied by
    ``q_scale`` if given; its rotated keys and its values stored at cache slots ``slot_mapping``
    (int64 [tokens]; negative: a padded token, not stored). Returns the queries, a [tokens, num_heads,
    head_dim] view of qkv. Slots are trusted (no device sync)."""
    require(qkv.dim() == 2 and qkv.stride(1) == 1,
            f"qkv must be 2-D [tokens, (heads + 2 * kv_heads) * head_dim] with unit last stride, "
            f"got shape {tuple(qkv.shape)} strides {qkv.stride()}")
    require(k_cache.dim() == 4 and v_cache.shape == k_cache.shape,
            f"k_cache and v_cache must be one 4-D [num_blocks, block_size, kv_heads, head_dim] shape, "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    tokens, width = qkv.shape
    _, block_size, cache_kv_heads, head_dim = k_cache.shape
    require(num_heads > 0 and cache_kv_heads == num_kv_heads and width == (num_heads + 2 * num_kv_heads) * head_dim,
            f"qkv width {width} must be (num_heads {num_heads} + 2 * kv_heads {num_kv_heads}) x head_dim "
            f"{head_dim} of the cache {tuple(k_cache.shape)}")
    require(head_dim % 2 == 0, f"head_dim must be even, got {head_dim}")
    require(qkv.dtype in FLOAT_DTYPES and k_cache.dtype == qkv.dtype and v_cache.dtype == qkv.dtype,
            f"qkv and caches must share one of float16/bfloat16/float32, got {qkv.dtype}, {k_cache.dtype}, "
            f"{v_cache.dtype}")
    require(k_cache.stride(3) == 1 and v_cache.stride(3) == 1, "k_cache and v_cache must be contiguous in head_dim")
    require_int("positions", positions, torch.int64, 1)
    require_int("slot_mapping", slot_mapping, torch.int64, 1)
    require(positions.shape[0] == tokens and slot_mapping.shape[0] == tokens,
            f"positions ({positions.shape[0]}) and slot_mapping ({slot_mapping.shape[0]}) need one entry per "
            f"token ({tokens})")
    require(cos.dtype == sin.dtype == torch.float32 and cos.is_contiguous() and sin.is_contiguous()
            and cos.shape == sin.shape and cos.dim() == 2 and cos.shape[1] == head_dim,
            f"cos and sin must be contiguous float32 [max_positions, {head_dim}], got {tuple(cos.shape)} "
            f"{cos.dtype} and {tuple(sin.shape)} {sin.dtype}")
    require_same_device(qkv=qkv, positions=positions, cos=cos, sin=sin, k_cache=k_cache, v_cache=v_cache,
                        slot_mapping=slot_mapping)
    if tokens:
        half = head_dim // 2
        _rope_write_kv_kernel[(tokens,)](
            qkv, positions, cos, sin, slot_mapping, k_cache, v_cache, 1.0 if q_scale is None else q_scale,
            num_heads, num_kv_heads, qkv.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            HALF=half, BLOCK_SIZE=block_size, BLOCK_HQ=triton.next_power_of_2(num_heads),
            BLOCK_HK=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(half),
            SCALED=q_scale is not None, **ROPE_OPTIONS)
    return qkv[:, : num_heads * head_dim].view(tokens, num_heads, head_dim)
