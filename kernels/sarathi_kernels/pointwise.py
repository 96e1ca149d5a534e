"""The decoder's elementwise work on CUDA as one Triton launch each, the same three ops and contracts
as ``cpu_ops``: residual add + RMSNorm, RoPE in place, SiLU(gate) * up.

Done as PyTorch ops each of these is several kernel launches (casts, a reduction, the rotation's
halves), and at decode sizes the host's launching, not the GPU, sets the forward's time; here each
is one launch. Each kernel rounds where transformers' code rounds (every product and sum back to
the tensor's dtype), so results match it within the last bit of a transcendental.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sarathi_kernels.cpu_ops import check_add_rms_norm, check_rope, check_silu_mul
from sarathi_kernels.triton_jit import jit

# The rotation rounds each product to the dtype before the sum, as torch does; Triton's default
# lets the compiler fuse them into one fma (one rounding fewer), which changes the last bit.
ROPE_OPTIONS = {"enable_fp_fusion": False}


@jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, hidden, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < hidden
    x = tl.load(x_ptr + row * hidden + offs, mask=ok, other=0.0)
    if HAS_RES:
        # x + residual in the tensors' dtype, as torch adds them, and kept as the next residual.
        x = (x.to(tl.float32) + tl.load(res_ptr + row * hidden + offs, mask=ok, other=0.0).to(tl.float32)).to(x.dtype)
        tl.store(res_ptr + row * hidden + offs, x, mask=ok)
    h = x.to(tl.float32)
    h = h * tl.math.rsqrt(tl.sum(h * h, axis=0) / hidden + eps)
    w = tl.load(w_ptr + offs, mask=ok, other=0.0)
    tl.store(out_ptr + row * hidden + offs, (w.to(tl.float32) * h.to(x.dtype).to(tl.float32)).to(x.dtype), mask=ok)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * rmsnorm(x + residual), with ``residual`` updated in place to x + residual (or
    weight * rmsnorm(x) without one). x, residual [rows, hidden] contiguous, weight [hidden]."""
    rows, hidden = x.shape
    check_add_rms_norm(x, residual, weight, where="")
    out = torch.empty_like(x)
    if rows:
        _add_rms_norm_kernel[(rows,)](x, x if residual is None else residual, weight, out, hidden, eps,
                                      HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(hidden))
    return out


@jit
def _rope_kernel(qk_ptr, pos_ptr, cos_ptr, sin_ptr, heads, stride_t, HALF: tl.constexpr,
                 BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    ok = (h < heads) & (d < HALF)
    pos = tl.load(pos_ptr + tok)
    # The tables are float32, cast to the tensor's dtype before use, as the torch code casts them.
    c = tl.load(cos_ptr + pos * 2 * HALF + d, mask=d < HALF, other=0.0)
    s = tl.load(sin_ptr + pos * 2 * HALF + d, mask=d < HALF, other=0.0)
    first = qk_ptr + tok * stride_t + h * 2 * HALF + d
    x1 = tl.load(first, mask=ok, other=0.0)
    x2 = tl.load(first + HALF, mask=ok, other=0.0)
    dt = x1.dtype
    c, s = c.to(dt).to(tl.float32), s.to(dt).to(tl.float32)
    a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
    # x * cos + rotate_half(x) * sin, each product rounded to the dtype before the sum.
    out1 = ((a1 * c).to(dt).to(tl.float32) + (-a2 * s).to(dt).to(tl.float32)).to(dt)
    out2 = ((a2 * c).to(dt).to(tl.float32) + (a1 * s).to(dt).to(tl.float32)).to(dt)
    tl.store(first, out1, mask=ok)
    tl.store(first + HALF, out2, mask=ok)


def rope_(qk: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotates qk [tokens, heads, d] (heads and d contiguous; rows may be strided, as q and k inside
    the fused qkv output) in place by the angles of ``positions`` (int64 [tokens]) in the float32
    tables cos, sin [max_positions, d], each row's halves equal (transformers' layout)."""
    tokens, heads, d = qk.shape
    check_rope(qk, positions, cos, sin, where="")
    if tokens:
        _rope_kernel[(tokens,)](qk, positions, cos, sin, heads, qk.stride(0), HALF=d // 2,
                                BLOCK_H=triton.next_power_of_2(heads), BLOCK_D=triton.next_power_of_2(d // 2),
                                **ROPE_OPTIONS)


@jit
def _silu_mul_kernel(in_ptr, out_ptr, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < inter
    gate = tl.load(in_ptr + row * 2 * inter + offs, mask=ok, other=0.0)
    up = tl.load(in_ptr + row * 2 * inter + inter + offs, mask=ok, other=0.0)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    tl.store(out_ptr + row * inter + offs, (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype), mask=ok)


def silu_mul(gate_up: torch.Tensor, *, block: int = 1024) -> torch.Tensor:
    """silu(gate) * up of gate_up [rows, 2 * inter] (gate first), contiguous."""
    rows, width = gate_up.shape
    check_silu_mul(gate_up, where="")
    out = gate_up.new_empty((rows, width // 2))
    if rows:
        _silu_mul_kernel[(rows, triton.cdiv(width // 2, block))](gate_up, out, width // 2, BLOCK=block)
    return out
