"""Linear layers over packed weights (oneDNN's and MKL's GEMM) compute what torch's F.linear computes."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from sarathi_lab import LLM
from sarathi_lab.attention import make_backend
from sarathi_lab.model import PRESETS, CausalLM, cpu_linear
from sarathi_lab.model.cpu_linear import (
    GEMMS,
    PackedLinear,
    describe,
    gemm_available,
    onednn_available,
    pack_linears,
)

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")
GEMMS_HERE = [g for g in GEMMS if gemm_available(g, torch.float32)]


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 70), in_features=st.integers(1, 300), out_features=st.integers(1, 300),
       bias=st.booleans(), one_row_packed=st.booleans(), gemm=st.sampled_from(GEMMS_HERE), seed=st.integers(0, 2**16))
def test_packed_linear_equals_f_linear(rows, in_features, out_features, bias, one_row_packed, gemm, seed):
    torch.manual_seed(seed)
    linear = nn.Linear(in_features, out_features, bias=bias)
    layer = PackedLinear(linear, gemm)
    layer.one_row_packed = one_row_packed  # either way the probe may choose
    x = torch.randn(rows, in_features)
    want = F.linear(x, linear.weight, linear.bias)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=1e-5)
        # Where the kernels build, forward sends 1-16 rows to their few-row linear, so the packed GEMM
        # at those rows (what runs without a compiler, and in float16) is called directly too.
        torch.testing.assert_close(layer._packed(x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not gemm_available("mkl", torch.float32), reason="this torch build has no MKL")
@pytest.mark.parametrize("bias", [False, True])
def test_mkl_reads_its_packed_weight_at_every_row_count(bias):
    # The packed copy holds another weight than the layer's own: a call that fell back to F.linear
    # on the original (torch does where the rows differ from the batch size it is given) would
    # return the original's product. MKL packs once, for whatever row count comes.
    torch.manual_seed(0)
    layer = PackedLinear(nn.Linear(160, 96, bias=bias), "mkl")
    other = torch.randn_like(layer.weight) / 160**0.5  # outputs ~1, as nn.Linear's own weights give
    with torch.no_grad():
        layer.packed_weight = torch.ops.mkl._mkl_reorder_linear_weight(other, 3)
    for rows in [*range(1, 70), 127, 128, 129, 255, 256, 257, 264, 300, 511, 512, 520, 600]:
        x = torch.randn(rows, 160)
        with torch.inference_mode():
            want = F.linear(x.double(), other.double(), None if layer.bias is None else layer.bias.double())
            torch.testing.assert_close(layer._packed(x).double(), want, rtol=1e-5, atol=1e-5,
                                       msg=lambda m, rows=rows: f"{rows} rows: {m}")


def test_packing_shares_the_parameters_so_tied_weights_and_state_dict_are_unchanged():
    config = copy.deepcopy(PRESETS["tiny"])
    config.tie_word_embeddings = True
    plain = CausalLM(config, make_backend("torch", torch.device("cpu")), max_positions=64)
    packed = copy.deepcopy(plain)
    pack_linears(packed)
    assert isinstance(packed.lm_head, PackedLinear) and isinstance(packed.layers[0].mlp.down_proj, PackedLinear)
    layers = [m for m in packed.modules() if isinstance(m, PackedLinear)]
    assert len({m.one_row_packed for m in layers}) == 1  # one probe decides for the whole model
    assert packed.lm_head.weight is packed.embed_tokens.weight
    assert plain.state_dict().keys() == packed.state_dict().keys()
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(packed.state_dict()[key], value, rtol=0, atol=0)


def test_engine_gives_the_same_tokens_with_either_cpu_linear():
    prompts = [torch.randint(0, 4096, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 40, 90)]
    outs = [LLM("tiny", device="cpu", dtype="float32", cpu_linear=kind, chunk_size=32).generate(prompts, 12)
            for kind in ("aten", "onednn", "mkl", "auto")]
    assert all(out == outs[0] for out in outs)


@pytest.mark.parametrize("vendor, auto", [("GenuineIntel", "mkl"), ("AuthenticAMD", "onednn"), ("", "onednn")])
@pytest.mark.skipif(not (gemm_available("mkl", torch.float32) and onednn_available()), reason="needs MKL and oneDNN")
def test_auto_takes_mkl_only_on_an_intel_cpu(monkeypatch, vendor, auto):
    # MKL picks its code path by vendor and was measured faster only on an Intel CPU.
    monkeypatch.setattr(cpu_linear, "cpuinfo", lambda field: vendor if field == "vendor_id" else "")
    assert cpu_linear.packed_gemm("auto", torch.float32) == auto
    assert cpu_linear.packed_gemm("mkl", torch.float32) == "mkl"
    assert cpu_linear.packed_gemm("onednn", torch.float32) == "onednn"
    if onednn_available(torch.bfloat16):
        assert cpu_linear.packed_gemm("mkl", torch.bfloat16) == "onednn"  # MKL's packed GEMM is float32 only


@pytest.mark.parametrize("vendor, flags, cpu_linear_kind, dtype, rows", [
    ("AuthenticAMD", "fma avx2", "auto", torch.float32, cpu_linear.ATEN_ROWS),  # measured: EPYC Zen 3
    ("AuthenticAMD", "fma avx2 avx512f", "auto", torch.float32, None),  # oneDNN's AVX-512 code: not measured against
    ("AuthenticAMD", "fma avx2", "onednn", torch.float32, None),  # asked for by name
    ("AuthenticAMD", "fma avx2", "auto", torch.bfloat16, None),
    ("GenuineIntel", "fma avx2", "auto", torch.float32, None),  # MKL's packed GEMM already
])
@pytest.mark.skipif(not (gemm_available("mkl", torch.float32) and onednn_available()), reason="needs MKL and oneDNN")
def test_auto_gives_large_row_counts_to_mkl_on_a_cpu_without_avx512(monkeypatch, vendor, flags, cpu_linear_kind,
                                                                    dtype, rows):
    monkeypatch.setattr(cpu_linear, "cpuinfo", lambda field: {"vendor_id": vendor, "flags": flags}[field])
    gemm = cpu_linear.packed_gemm(cpu_linear_kind, dtype)
    assert cpu_linear.aten_from_rows(cpu_linear_kind, dtype, gemm) == rows


def test_rows_from_aten_rows_on_run_f_linear_over_the_weight_itself():
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    aten = cpu_linear.FLOAT32_KERNEL_ROWS + 10  # rows below it that the kernel does not take go to oneDNN
    layer = PackedLinear(linear, "onednn", aten_rows=aten)
    # A packed copy of another weight: only the layer's own weight gives F.linear's result.
    layer.packed_weight = torch.ops.mkldnn._reorder_linear_weight(torch.randn_like(linear.weight), 8)
    with torch.inference_mode():
        for rows, own in ((aten - 1, False), (aten, True), (aten + 60, True)):
            x = torch.randn(rows, 64)
            assert torch.equal(layer(x), F.linear(x, linear.weight, linear.bias)) == own, rows
    assert describe("onednn", 40) == "onednn, aten from 40 rows" and describe("mkl", None) == "mkl"
