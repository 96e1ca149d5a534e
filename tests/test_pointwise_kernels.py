"""The Triton elementwise kernels (sarathi_kernels.pointwise) against transformers' own LlamaRMSNorm,
apply_rotary_pos_emb and SiLU, run by Triton's interpreter on a machine without CUDA; and the
engine's greedy tokens through them against transformers' generate."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sarathi_kernels import pointwise
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from sarathi_lab import LLM
from sarathi_lab.model import layers
from sarathi_lab.model.decoder import CausalLM
from tests.hf_models import hf_greedy, save_random_model
from tests.triton_compile import compile_for_gpu

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def assert_close(actual, expected):
    # The interpreter truncates float32 to bfloat16 where a GPU rounds to nearest, so interpreted bf16
    # results may differ by a unit in the last place per rounding (more where a sum cancels):
    # measure/profiling/kernel_check.py holds the compiled kernels to torch's own bf16 tolerance.
    if actual.dtype == torch.bfloat16:
        torch.testing.assert_close(actual, expected, rtol=2**-6, atol=0.05)
    else:
        torch.testing.assert_close(actual, expected)


@pytest.fixture(autouse=True)
def fixed_seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm_matches_transformers(dtype, with_residual):
    rows, hidden, eps = 5, 96, 1e-5  # hidden not a power of two: the kernel's masked lanes
    x, residual = torch.randn(rows, hidden).to(dtype), torch.randn(rows, hidden).to(dtype)
    norm = LlamaRMSNorm(hidden, eps).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden))
        summed = x + residual if with_residual else x
        expected = norm(summed)
    kept = residual.clone() if with_residual else None
    out = pointwise.add_rms_norm(x, kept, norm.weight.detach(), eps)
    assert_close(out, expected)
    if with_residual:
        assert_close(kept, summed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_rotates_q_and_k_in_place_as_transformers_does(dtype):
    tokens, heads, kv_heads, d, max_pos = 7, 4, 2, 16, 64
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d).to(dtype)
    before = qkv.clone()
    positions = torch.randint(0, max_pos, (tokens,))
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.arange(max_pos).float()[:, None] * inv_freq[None, :]
    cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()
    # q and k as the decoder hands them over: a strided view of the fused qkv output.
    qk = qkv[:, : (heads + kv_heads) * d].view(tokens, heads + kv_heads, d)
    q, k = before[:, : heads * d].view(tokens, heads, d), before[:, heads * d: (heads + kv_heads) * d]
    expected_q, expected_k = apply_rotary_pos_emb(q, k.view(tokens, kv_heads, d), cos[positions].to(dtype),
                                                  sin[positions].to(dtype), unsqueeze_dim=1)
    pointwise.rope_(qk, positions, cos, sin)
    assert_close(qk[:, :heads], expected_q)
    assert_close(qk[:, heads:], expected_k)
    assert torch.equal(qkv[:, (heads + kv_heads) * d:], before[:, (heads + kv_heads) * d:]), "v was touched"


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_matches_transformers(dtype):
    inter = 100
    gate_up = torch.randn(3, 2 * inter).to(dtype)
    expected = ACT2FN["silu"](gate_up[:, :inter]) * gate_up[:, inter:]
    assert_close(pointwise.silu_mul(gate_up, block=64), expected)


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(0, 6), inter=st.integers(1, 300), block=st.sampled_from([16, 64, 1024]),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_silu_mul_equals_the_unfused_path_at_any_shape(rows, inter, block, dtype, seed):
    # The engine's torch path: split, SiLU, multiply (three passes over the gate_up output).
    gate_up = torch.randn(rows, 2 * inter, generator=torch.Generator().manual_seed(seed)).to(dtype)
    gate, up = gate_up.split(inter, dim=-1)
    assert_close(pointwise.silu_mul(gate_up, block=block), torch.nn.functional.silu(gate) * up)


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(0, 6), hidden=st.integers(1, 200), with_residual=st.booleans(),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_add_rms_norm_equals_the_unfused_path_at_any_shape(rows, hidden, with_residual, dtype,
                                                           seed):
    gen = torch.Generator().manual_seed(seed)
    norm = layers.RMSNorm(hidden, 1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden, generator=gen))
    x, residual = (torch.randn(rows, hidden, generator=gen).to(dtype) for _ in range(2))
    summed = x + residual if with_residual else x
    h = summed.float()
    expected = norm.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    kept = residual.clone() if with_residual else None
    assert_close(pointwise.add_rms_norm(x, kept, norm.weight.detach(), 1e-6), expected.detach())
    if with_residual:
        assert_close(kept, summed)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fused", ["pointwise", "own"])
def test_the_final_norm_adds_the_residual_of_the_sampled_rows_only(tmp_path, monkeypatch, dtype,
                                                                  fused):
    # norm(hidden + residual) of the sampled rows as before, its add now inside the fused norm (no
    # pass over every token): the same bits through Triton's kernel and the CPU's own path (the
    # interpreter's bf16 truncation aside: assert_close says why).
    if fused == "pointwise":
        monkeypatch.setattr(layers, "fused_ops", lambda x: pointwise)
    model = CausalLM(save_random_model("llama", tmp_path).config, None, 64).to(dtype)
    with torch.no_grad():
        model.norm.weight.copy_(torch.randn_like(model.norm.weight))
    hidden, residual = (torch.randn(9, model.config.hidden_size).to(dtype) for _ in range(2))
    rows = torch.tensor([8, 2, 5])
    kept = residual.clone()
    with torch.no_grad():
        out = model.final_norm(hidden, kept, rows)
        expected = model.norm((hidden + residual).index_select(0, rows))  # the unfused path
    if fused == "pointwise" and dtype == torch.bfloat16:
        assert_close(out, expected)
    else:
        assert torch.equal(out, expected)
    assert torch.equal(kept, residual), "the caller's residual was changed"


def test_bad_shapes_fail_in_one_line():
    with pytest.raises(ValueError, match="^silu_mul: contiguous"):
        pointwise.silu_mul(torch.randn(3, 5))
    with pytest.raises(ValueError, match="^add_rms_norm: contiguous"):
        pointwise.add_rms_norm(torch.randn(3, 8), None, torch.randn(7), 1e-5)


@pytest.mark.e2e
def test_greedy_tokens_through_the_triton_elementwise_kernels_match_transformers(tmp_path, monkeypatch):
    # What a CUDA device runs, here by Triton's interpreter: every norm, rotation and SiLU of the
    # forward through sarathi_kernels.pointwise, attention through the torch backend.
    model = save_random_model("llama", tmp_path)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist() for n in (11, 3)]
    expected = [hf_greedy(model, p, 4) for p in prompts]
    used = []

    def triton_everywhere(x):
        used.append(x.shape)
        return pointwise

    monkeypatch.setattr(layers, "fused_ops", triton_everywhere)
    llm = LLM(model=str(tmp_path), scheduler="sarathi", chunk_size=8, max_batch_size=2, device="cpu",
              dtype="float32", warmup_iters=0, attention="torch")
    assert llm.generate(prompts, max_new_tokens=4) == expected
    assert used


def test_the_gpu_kernel_check_s_pointwise_check_runs_here_through_the_interpreter(monkeypatch):
    # measure/profiling/kernel_check.py runs only on a GPU: a typo in it would cost a GPU run's step.
    from sarathi_lab.measure.profiling import kernel_check

    monkeypatch.setattr(kernel_check, "DEV", torch.device("cpu"))
    assert kernel_check.check_pointwise(torch.float32) == {"add_rms_norm": True, "rope": True, "silu_mul": True,
                                                           "rope_write_kv": True, "gemm": True,
                                                           "gemm_split_k": True, "gemm_silu_mul": True}


# Compiled for a Hopper GPU (through ptxas, no GPU needed): the interpreter never fuses, so only the
# compiler's own output shows whether the rotation rounds each product before the sum.
_ROPE_PTX = """
import sys
from sarathi_kernels.pointwise import ROPE_OPTIONS, _rope_kernel

print(compile(_rope_kernel, dict(qk_ptr="*" + sys.argv[1], pos_ptr="*i64", cos_ptr="*fp32", sin_ptr="*fp32"),
              dict(HALF=64, BLOCK_H=64, BLOCK_D=64), arch=90, **ROPE_OPTIONS).asm["ptx"])
"""


@pytest.mark.parametrize("dtype, ptx_type", [("fp16", "f16"), ("bf16", "bf16")])
def test_compiled_rope_rounds_each_product_before_the_sum(dtype, ptx_type):
    done = compile_for_gpu(_ROPE_PTX, dtype)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"mul.rn.{ptx_type}" in done.stdout, "no product rounded to the dtype"
    assert "fma.rn" not in done.stdout, "the compiler fused a product into its sum"
