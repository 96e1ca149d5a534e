"""The decoder's fused elementwise steps on the CPU (csrc/elementwise_cpu.cpp): residual add + RMSNorm,
rotary embedding in place, SiLU(gate) * up; linear layers of a few rows (csrc/linear_cpu.cpp);
greedy sampling's row argmax (csrc/argmax_cpu.cpp) and temperature and nucleus sampling's draw
(csrc/sample_cpu.cpp); float32 or bfloat16.

``supports(tensor)`` says whether a tensor can take this path (CPU, a dtype of ``DTYPES``, the
library built); the model asks it and otherwise runs its torch code. Wrappers check only what a
wrong call would misread (dtype, contiguity, shapes), with cheap attribute reads: they run several
times per layer.
"""
from __future__ import annotations

import ctypes
import functools
from array import array

import torch

from sarathi_kernels import cpu_build

DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}
_P, _I64, _F, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
_SIGNATURES = {
    "add_rms_norm": [_P, _P, _P, _P, _I64, _I64, _F, _INT],
    "rope": [_P, _P, _P, _P, _I64, _I64, _I64, _I64, _INT],
    "silu_mul": [_P, _P, _I64, _I64, _INT],
    "argmax": [_P, _I64, _I64, _P, _INT],
    "sample": [_P, _I64, _I64, _F, ctypes.c_double, _P, _P, _INT],
    "linear": [_P, _P, _P, _P, _I64, _I64, _I64, _INT],
    "linear_argmax": [_P, _P, _P, _P, _I64, _I64, _I64, _INT, _P],
    "linear_pack": [_P, _P, _I64, _I64],
}
# The most rows ``linear``'s few-row path takes (csrc/linear_cpu.cpp: one set of register accumulators
# per row); beyond, a GEMM in float32, and in bfloat16 where it runs on AMX (bf16_uses_amx), else none.
LINEAR_MAX_ROWS = 16


@functools.cache
def _fn(name: str, suffix: str):
    return cpu_build.function(f"{name}_{suffix}", _SIGNATURES[name])


def supports(x: torch.Tensor) -> bool:
    return x.is_cpu and x.dtype in DTYPES and cpu_build.library() is not None


_WHERE = "sarathi_kernels.cpu_ops: "


def _check(ok: bool, what: str, where: str = _WHERE) -> None:
    if not ok:
        raise ValueError(f"{where}{what}")


# The elementwise ops' contracts, here and in sarathi_kernels.pointwise (the same ops on CUDA), whose
# messages name no module: ``where`` prefixes the message.
def check_add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                       where: str = _WHERE) -> None:
    _check(x.is_contiguous() and weight.is_contiguous() and weight.shape == (x.shape[1],) and weight.dtype == x.dtype
           and (residual is None or (residual.shape == x.shape and residual.dtype == x.dtype
                                     and residual.is_contiguous())),
           "add_rms_norm: contiguous [rows, hidden] of one dtype", where)


def check_rope(qk: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               where: str = _WHERE) -> None:
    tokens, _, d = qk.shape
    _check(qk.stride(2) == 1 and qk.stride(1) == d and positions.dtype == torch.int64 and positions.is_contiguous()
           and positions.shape == (tokens,) and cos.dtype == sin.dtype == torch.float32 and cos.is_contiguous()
           and sin.is_contiguous() and cos.shape[1] == d and d % 2 == 0, "rope_: [tokens, heads, d] rows of "
           "contiguous heads, int64 positions, float32 contiguous tables", where)


def check_silu_mul(gate_up: torch.Tensor, where: str = _WHERE) -> None:
    _check(gate_up.is_contiguous() and gate_up.shape[1] % 2 == 0, "silu_mul: contiguous [rows, 2 * inter]", where)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * rmsnorm(x + residual), with ``residual`` updated in place to x + residual (or
    weight * rmsnorm(x) without one). x, residual [rows, hidden] contiguous, weight [hidden]."""
    rows, hidden = x.shape
    check_add_rms_norm(x, residual, weight)
    out = torch.empty_like(x)
    _fn("add_rms_norm", DTYPES[x.dtype])(x.data_ptr(), None if residual is None else residual.data_ptr(),
                                         weight.data_ptr(), out.data_ptr(), rows, hidden, eps,
                                         torch.get_num_threads())
    return out


def rope_(qk: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotates qk [tokens, heads, d] (heads and d contiguous; rows may be strided, as q and k inside
    the fused qkv output) in place by the angles of ``positions`` (int64 [tokens]) in the float32
    tables cos, sin [max_positions, d]."""
    tokens, heads, d = qk.shape
    check_rope(qk, positions, cos, sin)
    _fn("rope", DTYPES[qk.dtype])(qk.data_ptr(), positions.data_ptr(), cos.data_ptr(), sin.data_ptr(), tokens, heads,
                                  d, qk.stride(0), torch.get_num_threads())


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gate_up [rows, 2 * inter] (gate first), contiguous."""
    rows, width = gate_up.shape
    check_silu_mul(gate_up)
    out = gate_up.new_empty((rows, width // 2))
    _fn("silu_mul", DTYPES[gate_up.dtype])(gate_up.data_ptr(), out.data_ptr(), rows, width // 2,
                                           torch.get_num_threads())
    return out


def pack_linear(weight: torch.Tensor) -> torch.Tensor:
    """A copy of an nn.Linear weight [out, in] laid out for ``linear`` (csrc/linear_cpu.cpp says how)."""
    n, k = weight.shape
    _check(weight.is_contiguous() and weight.dim() == 2, "pack_linear: a contiguous [out, in] weight")
    packed = weight.new_empty(_packed_numel(n, k, weight.dtype))
    _fn("linear_pack", DTYPES[weight.dtype])(weight.data_ptr(), packed.data_ptr(), n, k)
    return packed


@functools.cache
def _tile_columns() -> int:
    """The packed weight's tile width: the library's vector width (16 floats with AVX-512, 8 with AVX2)."""
    return cpu_build.function("linear_tile_columns", [], ctypes.c_int64)()


@functools.cache
def bf16_uses_amx() -> bool:
    """Whether bfloat16 runs through AMX tile multiply-adds here (the few-row linear and the prefill
    attention): the library was built for a CPU with AMX and the OS let this process use it."""
    return bool(cpu_build.function("bf16_uses_amx", [], ctypes.c_int64)())


def _packed_numel(n: int, k: int, dtype: torch.dtype) -> int:
    pair, tile = (2 if dtype == torch.bfloat16 else 1), _tile_columns()
    return -(-n // tile) * tile * -(-k // pair) * pair


def linear(x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [rows, in], over ``packed`` = pack_linear(weight) of weight
    [out_features, in]; bias [out_features] or None; one dtype. Any rows >= 1 in float32, and in
    bfloat16 where it runs on AMX (beyond LINEAR_MAX_ROWS a GEMM); else 1 to LINEAR_MAX_ROWS. A row's
    results are the same bits whatever the other rows and however many (csrc/linear_cpu.cpp)."""
    gemm = x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and bf16_uses_amx())
    out = _linear_out(x, packed, out_features, bias, gemm or x.shape[0] <= LINEAR_MAX_ROWS,
                      "linear: contiguous x [rows, in] (float32, bfloat16 on AMX: rows >= 1; "
                      f"else 1..{LINEAR_MAX_ROWS})")
    _fn("linear", DTYPES[x.dtype])(x.data_ptr(), packed.data_ptr(), None if bias is None else bias.data_ptr(),
                                   out.data_ptr(), x.shape[0], out_features, x.shape[1], torch.get_num_threads())
    return out


def linear_argmax(x: torch.Tensor, packed: torch.Tensor, out_features: int,
                  bias: torch.Tensor | None = None) -> list[int]:
    """argmax(linear(x, packed, out_features, bias)) for 1 to LINEAR_MAX_ROWS rows, taken inside the
    kernel while each tile of outputs is in registers: each row's first index of its maximum (of its
    first NaN, if any), as argmax gives over the same outputs."""
    out = _linear_out(x, packed, out_features, bias, x.shape[0] <= LINEAR_MAX_ROWS,
                      f"linear_argmax: contiguous x [rows, in] (1..{LINEAR_MAX_ROWS} rows)")
    tokens = array("q", bytes(8 * x.shape[0]))
    _fn("linear_argmax", DTYPES[x.dtype])(x.data_ptr(), packed.data_ptr(), None if bias is None else bias.data_ptr(),
                                          out.data_ptr(), x.shape[0], out_features, x.shape[1],
                                          torch.get_num_threads(), tokens.buffer_info()[0])
    return tokens.tolist()


def _linear_out(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None, rows_ok: bool,
                what: str) -> torch.Tensor:
    """The output tensor [rows, n] of checked arguments (``what``: the refusal's words on x)."""
    rows, k = x.shape
    _check(rows >= 1 and rows_ok and x.is_contiguous() and x.is_cpu and packed.dtype == x.dtype and packed.is_cpu
           and packed.numel() == _packed_numel(n, k, x.dtype) and (bias is None or (
               bias.shape == (n,) and bias.dtype == x.dtype and bias.is_contiguous() and bias.is_cpu)),
           f"{what}, the packed weight of [out, in], bias [out], one dtype")
    return x.new_empty((rows, n))


def argmax(x: torch.Tensor) -> list[int]:
    """torch.argmax(x, dim=-1).tolist() of a contiguous [rows, cols] tensor: each row's first index of
    its maximum (of its first NaN, if any)."""
    rows, cols = x.shape
    _check(x.is_contiguous() and cols > 0, "argmax: contiguous [rows, cols], cols > 0")
    # Into an array, not a tensor: after a forward pass every torch op starts with its code out of
    # the caches, and torch.empty plus tolist were a third of this call when cold.
    out = array("q", bytes(8 * rows))
    _fn("argmax", DTYPES[x.dtype])(x.data_ptr(), rows, cols, out.buffer_info()[0], torch.get_num_threads())
    return out.tolist()


def sample(logits: torch.Tensor, temperature: float, top_p: float, u: list[float]) -> list[int] | None:
    """Each row's token drawn from softmax(logits / temperature) cut to its top-p nucleus, by the
    inverse CDF at u (one uniform in [0, 1) per row): over the tokens in id order when top_p is 1,
    else in descending probability, ties in id order, until the mass reaches top_p (the token that
    crosses it included). logits: contiguous [rows, vocab], float32 or bfloat16. None if a row has no
    distribution (a NaN or +inf logit, or only -inf): the caller's own code decides what such rows give."""
    rows, cols = logits.shape
    _check(logits.is_contiguous() and cols > 0 and len(u) == rows and 0 < top_p <= 1
           and temperature >= torch.finfo(torch.float32).tiny,
           "sample: contiguous [rows, vocab], one uniform per row, 0 < top_p <= 1, temperature >= float32's tiny")
    out, uniforms = array("q", bytes(8 * rows)), array("d", u)
    _fn("sample", DTYPES[logits.dtype])(logits.data_ptr(), rows, cols, temperature, top_p, uniforms.buffer_info()[0],
                                        out.buffer_info()[0], torch.get_num_threads())
    tokens = out.tolist()
    return None if -1 in tokens else tokens
