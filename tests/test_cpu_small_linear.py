"""The few-row CPU linear and its float32 GEMM (sarathi_kernels.cpu_ops.linear over pack_linear's copy)
against F.linear in float64, and the engine's linear layers sending decode batches to it."""
from __future__ import annotations

import os
from unittest.mock import patch

import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sarathi_kernels import cpu_ops
from torch import nn

from sarathi_lab.model import cpu_linear
from sarathi_lab.model.cpu_linear import PackedLinear, onednn_available

pytestmark = pytest.mark.skipif(not cpu_ops.supports(torch.zeros(1)), reason="the CPU kernels did not build here")


def _linear_inputs(rows, in_features, out_features, bias, dtype, seed):
    """x [rows, in], weight [out, in] and bias [out] (or None), seeded, in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=g).to(dtype)
    w = torch.randn(out_features, in_features, generator=g).to(dtype)
    b = torch.randn(out_features, generator=g).to(dtype) if bias else None
    return x, w, b


# _linear_inputs' arguments, any shape the kernel takes.
LINEAR_CASES = {"rows": st.integers(1, cpu_ops.LINEAR_MAX_ROWS), "in_features": st.integers(1, 300),
                "out_features": st.integers(1, 300), "bias": st.booleans(),
                "dtype": st.sampled_from([torch.float32, torch.bfloat16]), "seed": st.integers(0, 2**16)}


@settings(max_examples=80, deadline=None)
@given(**LINEAR_CASES | {"rows": st.integers(1, 80)})
@example(rows=16, in_features=2048, out_features=768, bias=False, dtype=torch.bfloat16, seed=0)
@example(rows=16, in_features=2048, out_features=768, bias=True, dtype=torch.float32, seed=0)
@example(rows=3, in_features=33, out_features=17, bias=True, dtype=torch.bfloat16, seed=1)
@example(rows=48, in_features=2048, out_features=768, bias=True, dtype=torch.float32, seed=0)
@example(rows=300, in_features=70, out_features=90, bias=True, dtype=torch.float32, seed=2)
@example(rows=100, in_features=96, out_features=200, bias=True, dtype=torch.bfloat16, seed=2)
@example(rows=33, in_features=64, out_features=40, bias=False, dtype=torch.bfloat16, seed=1)
def test_small_linear_equals_f_linear_in_float64(rows, in_features, out_features, bias, dtype, seed):
    rows = rows if _has_gemm(dtype) else min(rows, cpu_ops.LINEAR_MAX_ROWS)
    x, w, b = _linear_inputs(rows, in_features, out_features, bias, dtype, seed)
    got = cpu_ops.linear(x, cpu_ops.pack_linear(w), out_features, b)
    want = F.linear(x.double(), w.double(), None if b is None else b.double())
    assert got.dtype == dtype and got.shape == (rows, out_features)
    # float32: sums of up to 2048 products in blocks (csrc/linear_cpu.cpp), within what float32's own
    # F.linear errs here; bfloat16: products are exact, sums float32, one rounding of the output.
    magnitude = (x.double().abs() @ w.double().abs().t()).max().item() + 1
    tol = ({"rtol": 1e-5, "atol": 2e-7 * magnitude} if dtype == torch.float32
           else {"rtol": 2**-8, "atol": 1e-6 * magnitude})
    torch.testing.assert_close(got.double(), want, **tol)


@settings(max_examples=30, deadline=None)
@given(**LINEAR_CASES | {"rows": st.integers(2, cpu_ops.LINEAR_MAX_ROWS)})
@example(rows=16, in_features=2048, out_features=768, bias=True, dtype=torch.float32, seed=0)
@example(rows=9, in_features=130, out_features=200, bias=False, dtype=torch.float32, seed=1)
def test_a_rows_results_are_the_same_bits_in_any_batch(rows, in_features, out_features, bias, dtype, seed):
    # Blocking and row chunks change with the batch's rows, the sums' order must not: a decode
    # token's logits may not depend on which other requests share its iteration.
    x, w, b = _linear_inputs(rows, in_features, out_features, bias, dtype, seed)
    packed = cpu_ops.pack_linear(w)
    batch = cpu_ops.linear(x, packed, out_features, b)
    for r in sorted({0, rows // 2, rows - 1}):
        assert torch.equal(cpu_ops.linear(x[r:r + 1], packed, out_features, b)[0], batch[r])
    assert torch.equal(cpu_ops.linear(x[1:], packed, out_features, b), batch[1:])


def _has_gemm(dtype):
    """Whether ``dtype`` takes more than LINEAR_MAX_ROWS rows here: float32's GEMM (panels of six
    rows, a last one of 1-5), bfloat16's on AMX (32-row groups, the last padded; K % 32 in slabs)."""
    return cpu_ops.supports(torch.zeros(1)) and (dtype == torch.float32 or cpu_ops.bf16_uses_amx())


# Batches beyond LINEAR_MAX_ROWS: the kernel's GEMMs.
GEMM_CASES = LINEAR_CASES | {"rows": st.integers(cpu_ops.LINEAR_MAX_ROWS + 1, 80),
                             "dtype": st.sampled_from([d for d in (torch.float32, torch.bfloat16) if _has_gemm(d)])}


@settings(max_examples=30, deadline=None)
@given(**GEMM_CASES)
@example(rows=300, in_features=130, out_features=200, bias=True, dtype=torch.float32, seed=0)
@example(rows=48, in_features=2048, out_features=768, bias=True, dtype=torch.bfloat16, seed=0)
@example(rows=33, in_features=64, out_features=40, bias=False, dtype=torch.bfloat16, seed=1)
@example(rows=100, in_features=96, out_features=200, bias=True, dtype=torch.bfloat16, seed=2)
def test_a_rows_results_are_the_same_bits_in_the_gemm_and_the_few_row_path(rows, in_features, out_features, bias,
                                                                           dtype, seed):
    if not _has_gemm(dtype):
        return  # the examples above name bfloat16, which has no GEMM without AMX
    # A decode token's logits may not depend on whether 16 or 17 requests share its iteration: the
    # GEMM must sum in the few-row path's order, whatever panel (or the last, shorter one) a row is in.
    x, w, b = _linear_inputs(rows, in_features, out_features, bias, dtype, seed)
    packed = cpu_ops.pack_linear(w)
    batch = cpu_ops.linear(x, packed, out_features, b)
    few = cpu_ops.LINEAR_MAX_ROWS
    for r in sorted({0, 5, 6, rows // 2, rows - 1}):
        assert torch.equal(cpu_ops.linear(x[r:r + 1], packed, out_features, b)[0], batch[r]), f"row {r}"
    assert torch.equal(cpu_ops.linear(x[:few], packed, out_features, b), batch[:few])
    assert torch.equal(cpu_ops.linear(x[1:], packed, out_features, b), batch[1:])


@settings(max_examples=60, deadline=None)
@given(**LINEAR_CASES, ties=st.booleans(), special=st.sampled_from(["none", "zero", "nan", "-inf", "+inf"]),
       threads=st.sampled_from([1, 2]))
# cpu-small's LM head on a decode batch: 32,000 columns, ties among equal rounded logits likely.
@example(rows=16, in_features=768, out_features=32000, bias=False, dtype=torch.bfloat16, seed=0, ties=False,
         special="none", threads=2)
@example(rows=5, in_features=40, out_features=33, bias=True, dtype=torch.float32, seed=3, ties=True, special="nan",
         threads=2)
def test_the_fused_argmax_is_torch_s_argmax_of_the_kernel_s_outputs(rows, in_features, out_features, bias, dtype,
                                                                     seed, ties, special, threads):
    # Reference: torch.argmax over the same kernel's outputs (its first maximum, or its first NaN).
    # ties: every weight row repeated from the first third, so equal outputs sit at several columns;
    # special: one row of x all zero (every output its bias), NaN, or huge (outputs +-inf, NaN where
    # they meet), each of which the lanes' running maxima must resolve to the first index.
    x, w, b = _linear_inputs(rows, in_features, out_features, bias, dtype, seed)
    if ties:
        w = w[torch.arange(out_features) % max(1, out_features // 3)]
    if special != "none":
        x[rows // 2] = {"zero": 0.0, "nan": float("nan"), "-inf": -1e38, "+inf": 1e38}[special]
    if special in ("-inf", "+inf"):
        w = w.abs()  # same-signed products: the row's outputs overflow to one infinity
    packed = cpu_ops.pack_linear(w)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        want = cpu_ops.linear(x, packed, out_features, b).argmax(dim=-1).tolist()
        assert cpu_ops.linear_argmax(x, packed, out_features, b) == want
    finally:
        torch.set_num_threads(before)


def test_bfloat16_takes_amx_exactly_where_the_cpu_has_it():
    # The test above then checks the AMX path on such a CPU; tests/test_kernels_other_isas.py the
    # vector paths that other machines take.
    # Built for another machine kind's -march (tests/test_kernels_other_isas.py), no kind with AMX.
    from sarathi_lab.measure.profiling.machine import cpu_flags

    native = os.environ.get("SARATHI_KERNELS_MARCH", "native") == "native"
    assert cpu_ops.bf16_uses_amx() == (native and {"amx_tile", "amx_bf16"} <= cpu_flags())


def test_wrong_calls_are_refused():
    w = torch.randn(20, 8)
    packed = cpu_ops.pack_linear(w)
    for x in (torch.randn(0, 8), torch.randn(2, 9), torch.randn(2, 8, dtype=torch.bfloat16), torch.randn(8, 2).t(),
              torch.empty(2, 8, device="meta")):
        with pytest.raises(ValueError, match="linear"):
            cpu_ops.linear(x, packed, 20)
    with pytest.raises(ValueError, match="linear"):
        cpu_ops.linear(torch.randn(2, 8), packed, 20, torch.randn(19))
    with pytest.raises(ValueError, match="linear_argmax"):  # few-row paths only, on every CPU
        cpu_ops.linear_argmax(torch.randn(cpu_ops.LINEAR_MAX_ROWS + 1, 8), packed, 20)
    # bfloat16 has a GEMM on AMX only: beyond LINEAR_MAX_ROWS rows it is refused elsewhere.
    rows = cpu_ops.LINEAR_MAX_ROWS
    packed16 = cpu_ops.pack_linear(w.bfloat16())
    assert cpu_ops.linear(torch.randn(rows, 8, dtype=torch.bfloat16), packed16, 20).shape == (rows, 20)
    if cpu_ops.bf16_uses_amx():
        assert cpu_ops.linear(torch.randn(rows + 1, 8, dtype=torch.bfloat16), packed16, 20).shape == (rows + 1, 20)
    else:
        with pytest.raises(ValueError, match="linear"):
            cpu_ops.linear(torch.randn(rows + 1, 8, dtype=torch.bfloat16), packed16, 20)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_layers_send_few_rows_to_the_kernel_and_more_to_onednn(dtype):
    if not onednn_available(dtype):
        pytest.skip(f"this CPU's oneDNN cannot pack {dtype} (an AVX2-only machine: the engine keeps nn.Linear)")
    layer = PackedLinear(nn.Linear(64, 48, dtype=dtype))
    calls = []
    real = cpu_ops.linear

    def spy(x, *args):
        calls.append(x.shape[0])
        return real(x, *args)

    most = {torch.float32: cpu_linear.FLOAT32_KERNEL_ROWS,
            torch.bfloat16: cpu_linear.AMX_KERNEL_ROWS if cpu_ops.bf16_uses_amx() else cpu_linear.SMALL_ROWS}[dtype]
    assert layer.kernel_rows == most
    with patch.object(cpu_ops, "linear", spy), torch.inference_mode():
        for rows in (1, cpu_linear.SMALL_ROWS, most, most + 1, 200):
            x = torch.randn(rows, 64, dtype=dtype)
            want = F.linear(x.double(), layer.weight.double(), layer.bias.double())
            torch.testing.assert_close(layer(x).double(), want, rtol=2**-7, atol=1e-2)
    assert calls == [1, cpu_linear.SMALL_ROWS, most]
