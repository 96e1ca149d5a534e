"""The fused CPU elementwise kernels (sarathi_kernels.cpu_ops) against the torch code they replace in
model/layers.py (the same modules with the fused path switched off): float32 to rounding of the
sums' order, bfloat16 to one bfloat16 rounding step."""
from __future__ import annotations

from unittest.mock import patch

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sarathi_kernels import cpu_ops
from transformers import LlamaConfig

from sarathi_lab.model.layers import GatedMLP, RMSNorm, RotaryEmbedding

pytestmark = pytest.mark.skipif(not cpu_ops.supports(torch.zeros(1)), reason="the CPU kernels did not build here")
DTYPES = st.sampled_from([torch.float32, torch.bfloat16])


def _torch_path(fn):
    with patch.object(cpu_ops, "supports", lambda x: False):
        return fn()


def _close(got, want, dtype):
    # bfloat16: the intermediate roundings (a bfloat16 ulp is 2^-8 relative) may each land one step
    # apart when the float32 values before them differ in their last bits: up to two steps here.
    tol = {"rtol": 1.3e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2**-6, "atol": 8e-3}
    assert got.dtype == want.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), **tol)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 40), hidden=st.sampled_from([8, 64, 768, 1000]), residual=st.booleans(), dtype=DTYPES,
       seed=st.integers(0, 2**16))
def test_add_rms_norm_equals_torch(rows, hidden, residual, dtype, seed):
    torch.manual_seed(seed)
    norm = RMSNorm(hidden, 1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.normal_()
    x, res = torch.randn(rows, hidden).to(dtype), torch.randn(rows, hidden).to(dtype)
    want = _torch_path(lambda: norm(x, res.clone() if residual else None))
    got_res = res.clone()
    got = norm(x, got_res if residual else None)
    if residual:
        _close(got[0], want[0], dtype)
        assert torch.equal(got[1], want[1]) and torch.equal(got_res, want[1])  # the sum rounds once either way
    else:
        _close(got, want, dtype)


@settings(max_examples=30, deadline=None)
@given(tokens=st.integers(1, 30), q_heads=st.integers(1, 6), kv_heads=st.integers(1, 3),
       head_dim=st.sampled_from([8, 64, 80]), scaling=st.sampled_from([None, "linear"]), dtype=DTYPES,
       seed=st.integers(0, 2**16))
def test_rope_in_place_equals_torch(tokens, q_heads, kv_heads, head_dim, scaling, dtype, seed):
    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=head_dim * q_heads, num_attention_heads=q_heads, head_dim=head_dim,
                         rope_scaling={"rope_type": "linear", "factor": 2.0} if scaling else None)
    rotary = RotaryEmbedding(config, head_dim, 512)
    # q and k inside a fused qkv row, as the decoder hands them over: strided rows.
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * head_dim).to(dtype)
    positions = torch.randint(0, 512, (tokens,))
    view = lambda t: t[:, : (q_heads + kv_heads) * head_dim].view(tokens, -1, head_dim)
    want = _torch_path(lambda: rotary(positions, view(qkv.clone())))
    fused = qkv.clone()
    got = rotary(positions, view(fused))
    assert got.data_ptr() == fused.data_ptr()  # in place
    _close(got, want, dtype)
    assert torch.equal(fused[:, (q_heads + kv_heads) * head_dim :], qkv[:, (q_heads + kv_heads) * head_dim :])


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 40), inter=st.sampled_from([8, 100, 2048]), dtype=DTYPES, seed=st.integers(0, 2**16))
def test_silu_mul_equals_torch(rows, inter, dtype, seed):
    torch.manual_seed(seed)
    mlp = GatedMLP(16, inter).to(dtype)
    gate_up = (3 * torch.randn(rows, 2 * inter)).to(dtype)
    mlp.down_proj = torch.nn.Identity()  # the product itself, before the projection
    mlp.gate_up_proj = torch.nn.Identity()
    _close(mlp(gate_up), _torch_path(lambda: mlp(gate_up)), dtype)


def test_wrong_layouts_are_refused():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="add_rms_norm"):
        cpu_ops.add_rms_norm(x.t(), None, torch.ones(4), 1e-6)
    with pytest.raises(ValueError, match="rope_"):
        cpu_ops.rope_(torch.randn(3, 2, 8).transpose(1, 2), torch.arange(3), torch.ones(4, 8), torch.ones(4, 8))
    with pytest.raises(ValueError, match="silu_mul"):
        cpu_ops.silu_mul(torch.randn(3, 5))
