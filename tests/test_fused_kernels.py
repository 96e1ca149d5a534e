"""The fused Triton kernels against the unfused torch references they replace, in Triton's
interpreter: RoPE + the KV-cache write (+ the q scale) against transformers' apply_rotary_pos_emb and
attention/reference.py's cache write; the split-K GEMM against torch.matmul, and its SiLU*mul epilogue
against transformers' SiLU times up."""
from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sarathi_kernels.gemm import GemmConfig, gemm, split_k_for
from sarathi_kernels.rope_kv import rope_write_kv
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from sarathi_lab.attention.reference import write_kv

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def tables(d: int, max_pos: int):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.arange(max_pos).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), -1)
    return emb.cos(), emb.sin()


def close(actual, expected, dtype):
    # The interpreter truncates float32 to bfloat16 where a GPU rounds to nearest: a last-place unit
    # per rounding (tests/test_pointwise_kernels.py); the compiled kernels are held to torch's tolerance.
    if dtype == torch.bfloat16:
        torch.testing.assert_close(actual, expected, rtol=2**-6, atol=0.05)
    else:
        torch.testing.assert_close(actual, expected)


@settings(max_examples=12, deadline=None)
@given(tokens=st.integers(1, 9), heads=st.sampled_from([(2, 2), (4, 1), (4, 2), (6, 2)]),
       d=st.sampled_from([8, 16, 32]), block_size=st.sampled_from([4, 16]), dtype=st.sampled_from(DTYPES),
       scaled=st.booleans(), padded=st.integers(0, 2), seed=st.integers(0, 2**16))
def test_rope_write_kv_equals_rope_then_write(tokens, heads, d, block_size, dtype, scaled, padded, seed):
    torch.manual_seed(seed)
    num_heads, kv_heads = heads
    max_pos, num_blocks = 64, 8
    cos, sin = tables(d, max_pos)
    qkv = torch.randn(tokens, (num_heads + 2 * kv_heads) * d).to(dtype)
    positions = torch.randint(0, max_pos, (tokens,))
    slots = torch.randperm(num_blocks * block_size)[:tokens]
    # The last ``padded`` tokens are a CUDA graph's padding: slot -1, nothing stored for them.
    pad = min(padded, tokens - 1)
    if pad:
        slots[tokens - pad:] = -1
    k_cache = torch.randn(num_blocks, block_size, kv_heads, d).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, d).to(dtype)
    exp_k_cache, exp_v_cache = k_cache.clone(), v_cache.clone()
    before = qkv.clone()

    q = before[:, : num_heads * d].view(tokens, num_heads, d)
    k = before[:, num_heads * d: (num_heads + kv_heads) * d].view(tokens, kv_heads, d)
    v = before[:, (num_heads + kv_heads) * d:].view(tokens, kv_heads, d)
    exp_q, exp_k = apply_rotary_pos_emb(q, k, cos[positions].to(dtype), sin[positions].to(dtype), unsqueeze_dim=1)
    scale = d**-0.5
    if scaled:
        exp_q = exp_q * scale
    real = slots >= 0
    write_kv(exp_k[real], v[real], exp_k_cache, exp_v_cache, slots[real])

    out_q = rope_write_kv(qkv, positions, cos, sin, k_cache, v_cache, slots, num_heads, kv_heads,
                          q_scale=scale if scaled else None)
    assert out_q.data_ptr() == qkv.data_ptr() and out_q.shape == (tokens, num_heads, d)
    close(out_q, exp_q, dtype)
    close(k_cache, exp_k_cache, dtype)
    assert torch.equal(v_cache, exp_v_cache), "values are copied, not computed"
    assert torch.equal(qkv[:, num_heads * d:], before[:, num_heads * d:]), "k and v columns of qkv were touched"


def test_rope_write_kv_refuses_a_width_that_is_not_the_heads_in_one_line():
    cache = torch.zeros(2, 4, 2, 8)
    with pytest.raises(ValueError, match=r"qkv width 40 must be \(num_heads 2 \+ 2 \* kv_heads 2\) x head_dim 8"):
        rope_write_kv(torch.zeros(3, 40), torch.zeros(3, dtype=torch.int64), *tables(8, 16), cache, cache.clone(),
                      torch.zeros(3, dtype=torch.int64), 2, 2)


CONFIGS = st.builds(GemmConfig, block_m=st.sampled_from([16, 32]), block_n=st.sampled_from([16, 32]),
                    block_k=st.sampled_from([16, 32]), split_k=st.integers(1, 4))


@settings(max_examples=12, deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 48), k=st.integers(1, 80), config=CONFIGS,
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_gemm_equals_torch_matmul(m, n, k, config, dtype, seed):
    torch.manual_seed(seed)
    x, w = (torch.randn(m, k) / k**0.5).to(dtype), torch.randn(n, k).to(dtype)
    expected = (x.float() @ w.float().T).to(dtype) if dtype != torch.float32 else x @ w.T
    close(gemm(x, w, config), expected, dtype)


@settings(max_examples=10, deadline=None)
@given(m=st.integers(1, 33), inter=st.integers(1, 40), k=st.integers(1, 64), config=CONFIGS,
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_gated_gemm_equals_matmul_then_silu_mul(m, inter, k, config, dtype, seed):
    torch.manual_seed(seed)
    x, w = (torch.randn(m, k) / k**0.5).to(dtype), torch.randn(2 * inter, k).to(dtype)
    gate_up = (x.float() @ w.float().T).to(dtype)
    expected = ACT2FN["silu"](gate_up[:, :inter]) * gate_up[:, inter:]
    close(gemm(x, w, config, gated=True), expected, dtype)


def test_a_bad_gemm_config_fails_in_one_line():
    with pytest.raises(ValueError, match="gemm block_k must be a power of two >= 16, got 24"):
        gemm(torch.zeros(2, 4), torch.zeros(3, 4), GemmConfig(block_k=24))


def test_split_k_fills_the_sms_and_keeps_walks_long():
    config = GemmConfig(block_m=64, block_n=128, block_k=64)
    # LLaMA-13B's o_proj at 256 tokens: 4 x 40 = 160 tiles already more than 132 SMs: no split.
    assert split_k_for(256, 5120, 5120, 132, config) == 1
    # Its down_proj at 128 tokens: 2 x 40 = 80 tiles, 216 K tiles; two programs a SM: 264 // 80 = 3 splits.
    assert split_k_for(128, 5120, 13824, 132, config, programs_per_sm=2) == 3
    # A short K caps the split at a quarter of its tiles.
    assert split_k_for(64, 128, 256, 132, config) == 1


# Compiled for Hopper (through ptxas, no GPU needed) at the benchmark models' shapes, with the alignment an
# engine launch has: ptxas's own count of spilled registers, and whether the rotation's products were fused
# into fmas (the interpreter never fuses; the unfused RoPE kernel rounds each product before the sum).
_SPILLS = """
import json
import triton.language as tl
from sarathi_kernels.gemm import _gemm_kernel, _reduce_kernel
from sarathi_kernels.pointwise import ROPE_OPTIONS
from sarathi_kernels.rope_kv import _rope_write_kv_kernel
from sarathi_lab.measure.profiling.gemm_sweep import TILINGS

def aligned(kernel, *more):
    return [n for n in kernel.arg_names if n.endswith("_ptr") or n.startswith("stride")] + list(more)

found = {}
for heads, kv in ((40, 40), (32, 8)):  # LLaMA-13B, Mistral-7B; head_dim 128
    k = compile(_rope_write_kv_kernel, dict(qkv_ptr="*bf16", pos_ptr="*i64", cos_ptr="*fp32", sin_ptr="*fp32",
                slot_ptr="*i64", k_cache_ptr="*bf16", v_cache_ptr="*bf16", q_scale="fp32"),
                dict(HALF=64, BLOCK_SIZE=16, BLOCK_HQ=1 << (heads - 1).bit_length(),
                     BLOCK_HK=1 << (kv - 1).bit_length(), BLOCK_D=64, SCALED=False),
                arch=90, aligned=aligned(_rope_write_kv_kernel), **ROPE_OPTIONS)
    found[f"rope_write_kv {heads}/{kv}"] = spill_bytes(k, 90) + ("fma.rn" in k.asm["ptx"],)
types = dict(x_ptr="*bf16", w_ptr="*bf16", out_ptr="*bf16", part_ptr="*fp32")
for t in TILINGS:  # the plain GEMM, and the gated one split (two accumulators: the most registers)
    for gated, split in ((False, 1), (True, 2)):
        k = compile(_gemm_kernel, types, dict(BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
                    SPLIT_K=split, GATED=gated, DOT_DTYPE=tl.bfloat16, PRECISION=None), arch=90,
                    aligned=aligned(_gemm_kernel, "num_n", "num_k", "up_offset"), num_warps=t.num_warps,
                    num_stages=t.num_stages)
        found[f"gemm {t.block_m}x{t.block_n}x{t.block_k} gated={gated}"] = spill_bytes(k, 90) + (False,)
k = compile(_reduce_kernel, dict(part_ptr="*fp32", out_ptr="*bf16"), dict(SPLIT_K=4, GATED=True, BLOCK=256), arch=90,
            aligned=aligned(_reduce_kernel))
found["reduce"] = spill_bytes(k, 90) + (False,)
print(json.dumps(found))
"""


@pytest.mark.slow
def test_fused_kernels_compile_for_hopper_without_spills_or_fused_rotations():
    from tests.triton_compile import compile_for_gpu

    done = compile_for_gpu(_SPILLS)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(found) == 2 + 2 * 4 + 1
    assert {name: spilled for name, (_, spilled, _) in found.items() if spilled} == {}, found
    assert not any(fma for _, _, fma in found.values()), found
