"""The paged attention kernels' shared pieces: one key/value tile's online-softmax step over the paged
cache (``_attend_kv_tile``), the dot's operand type, and the unsplit launch's stand-in partials. One
home for the three kernels that walk keys (paged_attention, chunk_attention, pod_attention)."""
from __future__ import annotations

import torch
import triton.language as tl

from sarathi_kernels.triton_jit import INTERPRETED, jit

_LOG2E = 1.4426950408889634

@jit
def _attend_kv_tile(acc, m_i, l_i, q, n_start, kv_end, row_limit, table_ptr,
                    k_ptr, v_ptr, stride_kb, stride_ks, stride_vb, stride_vs, offs_d, d_ok, scale_log2,
                    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    offs_n = n_start + tl.arange(0, BLOCK_N)
    if MASKED:
        in_ctx = offs_n < kv_end
        k_ok = in_ctx[None, :] & d_ok[:, None]
        v_ok = in_ctx[:, None] & d_ok[None, :]
    else:
        k_ok = d_ok[:, None]
        v_ok = d_ok[None, :]
    if BLOCK_SIZE % BLOCK_N == 0:
        # The tile lies in one cache block (n_start is a multiple of BLOCK_N): one table entry, and
        # positions past the context still address that block's own slots (masked).
        block = tl.load(table_ptr + n_start // BLOCK_SIZE).to(tl.int64)
        within = n_start % BLOCK_SIZE + tl.arange(0, BLOCK_N)
        k_rows = block * stride_kb + within * stride_ks
        v_rows = block * stride_vb + within * stride_vs
    else:
        if MASKED:
            # Past the context the table may end; block 0 is a safe address and the loads are masked.
            blocks = tl.load(table_ptr + offs_n // BLOCK_SIZE, mask=in_ctx, other=0).to(tl.int64)
        else:
            blocks = tl.load(table_ptr + offs_n // BLOCK_SIZE).to(tl.int64)
        within = offs_n % BLOCK_SIZE
        k_rows = blocks * stride_kb + within * stride_ks
        v_rows = blocks * stride_vb + within * stride_vs
    k = tl.load(k_ptr + k_rows[None, :] + offs_d[:, None], mask=k_ok, other=0.0)
    s = tl.dot(q, k.to(DOT_DTYPE), input_precision=PRECISION) * scale_log2
    if MASKED:
        s = tl.where((offs_n[None, :] <= row_limit[:, None]) & in_ctx[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if MASKED:
        # A row that has seen no key yet keeps m = -inf (a split's walk can start past the row, and a
        # padded request has no keys): subtracting 0 then keeps its weights at 0 rather than NaN.
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        # Unmasked tiles come first in every walk and every row sees all their keys: m_new is finite.
        m_sub = m_new
    alpha = tl.exp2(m_i - m_sub)
    p = tl.exp2(s - m_sub[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    # Unwritten cache slots may hold NaN; zero them so p == 0 cannot turn into 0 * NaN.
    v = tl.load(v_ptr + v_rows[:, None] + offs_d[None, :], mask=v_ok, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=PRECISION)
    return acc, m_new, l_i


@jit
def _walk_keys(q, lo, hi, full_end, kv_end, row_limit, table_ptr, k_ptr, v_ptr, stride_kb, stride_ks,
               stride_vb, stride_vs, offs_d, d_ok, scale_log2, BLOCK_M: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
               BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    """One (query tile, KV head)'s walk over key positions [lo, hi): the tiles every row sees whole first,
    unmasked, then the causal tail from ``full_end``; the unnormalised (acc, m, l)."""
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    for n_start in range(lo, tl.minimum(hi, full_end), BLOCK_N):
        acc, m_i, l_i = _attend_kv_tile(acc, m_i, l_i, q, n_start, kv_end, row_limit, table_ptr,
                                        k_ptr, v_ptr, stride_kb, stride_ks, stride_vb, stride_vs, offs_d, d_ok,
                                        scale_log2, BLOCK_SIZE, BLOCK_N, False, DOT_DTYPE, PRECISION)
    for n_start in range(tl.maximum(lo, full_end), hi, BLOCK_N):
        acc, m_i, l_i = _attend_kv_tile(acc, m_i, l_i, q, n_start, kv_end, row_limit, table_ptr,
                                        k_ptr, v_ptr, stride_kb, stride_ks, stride_vb, stride_vs, offs_d, d_ok,
                                        scale_log2, BLOCK_SIZE, BLOCK_N, True, DOT_DTYPE, PRECISION)
    return acc, m_i, l_i

_TL_DTYPE = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def _dot_dtype(dtype: torch.dtype):
    # The interpreter's tl.dot multiplies bf16 operands as raw bits; fp32 tiles give the right answer.
    if dtype == torch.bfloat16 and INTERPRETED:
        return tl.float32
    return _TL_DTYPE[dtype]


# An unsplit launch still passes fp32 partial pointers (never written), so that it shares the split
# launch's compiled kernel: a pointer's element type is part of the specialisation key.
_NO_PARTIALS: dict[torch.device, torch.Tensor] = {}


def _no_partials(device: torch.device) -> torch.Tensor:
    if device not in _NO_PARTIALS:
        _NO_PARTIALS[device] = torch.zeros(4, dtype=torch.float32, device=device)
    return _NO_PARTIALS[device]
