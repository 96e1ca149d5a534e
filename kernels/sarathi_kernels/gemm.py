"""A split-K Triton GEMM in nn.Linear's layout (out = x @ weight.T), the alternative to cuBLAS at the
hybrid batch's token counts, with SiLU(gate) * up as an optional epilogue.

Why split K: at M = 128-1024 tokens a 128 x 128 output tiling of o_proj or down_proj is a few dozen
tiles, under one wave on a GPU of 100+ SMs, each tile walking a long K alone. Splitting every tile's
K walk over ``split_k`` programs fills the SMs; each writes an fp32 partial and a reduce kernel sums
them (the partials cost M x N x split_k x 4 bytes of traffic, small beside the weight at these M).

Gated (``gated=True``, weight [2 * inter, K], gate rows first, as GatedMLP's gate_up_proj): each
program computes matching gate and up tiles and the epilogue (or the reduce, when split) stores
SiLU(gate) * up [M, inter], so the MLP's activation needs no launch of its own and gate_up's output
never reaches memory. The epilogue rounds where ``pointwise.silu_mul`` rounds, from the product
rounded to the dtype as a separate GEMM would have stored it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sarathi_kernels._checks import FLOAT_DTYPES, require
from sarathi_kernels.triton_jit import INTERPRETED, jit


@dataclass(frozen=True)
class GemmConfig:
    """One launch's tiling; ``split_k`` 1 writes the output directly."""

    block_m: int = 64
    block_n: int = 128
    block_k: int = 64
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3

    def check(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            require(value >= 16 and value & (value - 1) == 0, f"gemm {name} must be a power of two >= 16, got {value}")
        require(self.split_k >= 1, f"gemm split_k must be >= 1, got {self.split_k}")


def split_k_for(m: int, n: int, k: int, num_sms: int, config: GemmConfig, programs_per_sm: int = 1) -> int:
    """The split that brings the launch to ``programs_per_sm`` programs a SM, keeping each split at
    least four K tiles long (shorter walks spend more on their partials than they save)."""
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    k_tiles = triton.cdiv(k, config.block_k)
    wanted = max(1, (programs_per_sm * num_sms) // tiles)
    return max(1, min(wanted, k_tiles // 4))


@jit
def _silu_mul(gate, up, DTYPE: tl.constexpr):
    """SiLU(gate) * up from fp32 sums, each rounded to the output dtype first as a stored GEMM would be."""
    g = gate.to(DTYPE).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(DTYPE).to(tl.float32)
    return (act * up.to(DTYPE).to(tl.float32)).to(DTYPE)


@jit(do_not_specialize=("num_m",))
def _gemm_kernel(x_ptr, w_ptr, out_ptr, part_ptr, num_m, num_n, num_k, stride_xm, stride_wn, stride_om, up_offset,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                 GATED: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    tiles_n = tl.cdiv(num_n, BLOCK_N)
    tile = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = (tile // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (tile % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < num_m
    n_ok = offs_n < num_n
    # This split's K range: whole K tiles, shares differing by at most one tile.
    k_tiles = tl.cdiv(num_k, BLOCK_K)
    k_lo = (split * k_tiles // SPLIT_K) * BLOCK_K
    k_hi = tl.minimum(((split + 1) * k_tiles // SPLIT_K) * BLOCK_K, num_k)
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    w_rows = w_ptr + offs_n.to(tl.int64)[None, :] * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < k_hi
        x = tl.load(x_rows + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0).to(DOT_DTYPE)
        w_ok = k_ok[:, None] & n_ok[None, :]
        w = tl.load(w_rows + offs_k[:, None], mask=w_ok, other=0.0).to(DOT_DTYPE)
        acc = tl.dot(x, w, acc, input_precision=PRECISION)
        if GATED:
            w_up = tl.load(w_rows + up_offset + offs_k[:, None], mask=w_ok, other=0.0).to(DOT_DTYPE)
            acc_up = tl.dot(x, w_up, acc_up, input_precision=PRECISION)
    ok = m_ok[:, None] & n_ok[None, :]
    if SPLIT_K == 1:
        dst = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
        if GATED:
            tl.store(dst, _silu_mul(acc, acc_up, out_ptr.dtype.element_ty), mask=ok)
        else:
            tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=ok)
    else:
        # Partials [split, M, N] (gated: [split, 2, M, N], gate then up), fp32.
        width = 2 if GATED else 1
        base = (split * width * num_m + offs_m.to(tl.int64))[:, None] * num_n + offs_n[None, :]
        tl.store(part_ptr + base, acc, mask=ok)
        if GATED:
            tl.store(part_ptr + base + num_m * num_n, acc_up, mask=ok)


@jit(do_not_specialize=("num_m",))
def _reduce_kernel(part_ptr, out_ptr, num_m, num_n, stride_om, SPLIT_K: tl.constexpr, GATED: tl.constexpr,
                   BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < num_n
    width = 2 if GATED else 1
    acc = tl.zeros([BLOCK], tl.float32)
    acc_up = tl.zeros([BLOCK], tl.float32)
    for split in range(SPLIT_K):
        base = (split * width * num_m + row) * num_n + offs
        acc += tl.load(part_ptr + base, mask=ok, other=0.0)
        if GATED:
            acc_up += tl.load(part_ptr + base + num_m * num_n, mask=ok, other=0.0)
    dst = out_ptr + row * stride_om + offs
    if GATED:
        tl.store(dst, _silu_mul(acc, acc_up, out_ptr.dtype.element_ty), mask=ok)
    else:
        tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=ok)


_TL_DTYPE = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}
REDUCE_BLOCK = 256


def gemm(x: torch.Tensor, weight: torch.Tensor, config: GemmConfig = GemmConfig(), *,
         gated: bool = False) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T -> [M, N] in x's dtype (fp32 accumulation); ``gated``: weight
    [2 * inter, K] and the result SiLU(x @ gate.T) * (x @ up.T) [M, inter]."""
    config.check()
    require(x.dim() == 2 and weight.dim() == 2 and x.shape[1] == weight.shape[1],
            f"gemm needs x [M, K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}")
    require(x.dtype in FLOAT_DTYPES and weight.dtype == x.dtype,
            f"x and weight must share one of float16/bfloat16/float32, got {x.dtype} and {weight.dtype}")
    require(x.stride(1) == 1 and weight.stride(1) == 1, "x and weight must be contiguous in K")
    require(x.device == weight.device, f"x on {x.device} and weight on {weight.device}")
    require(not gated or weight.shape[0] % 2 == 0, f"a gated weight needs an even row count, got {weight.shape[0]}")
    m, k = x.shape
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    out = x.new_empty((m, n))
    if m == 0 or n == 0:
        return out
    # The interpreter's tl.dot multiplies bf16 operands as raw bits; fp32 tiles give the right answer.
    dot = tl.float32 if INTERPRETED and x.dtype == torch.bfloat16 else _TL_DTYPE[x.dtype]
    split = min(config.split_k, triton.cdiv(k, config.block_k))
    part = (torch.empty((split * (2 if gated else 1) * m * n,), dtype=torch.float32, device=x.device)
            if split > 1 else out)
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    _gemm_kernel[(tiles, split)](
        x, weight, out, part, m, n, k, x.stride(0), weight.stride(0), out.stride(0), n * weight.stride(0),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPLIT_K=split, GATED=gated,
        DOT_DTYPE=dot, PRECISION="ieee" if x.dtype == torch.float32 else None,
        num_warps=config.num_warps, num_stages=config.num_stages)
    if split > 1:
        _reduce_kernel[(m, triton.cdiv(n, REDUCE_BLOCK))](part, out, m, n, out.stride(0), SPLIT_K=split, GATED=gated,
                                                          BLOCK=REDUCE_BLOCK)
    return out
