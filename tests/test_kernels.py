"""The Triton kernels against attention/reference.py, run by Triton's interpreter on a machine without
CUDA (sarathi_kernels.triton_jit chooses it; nothing in the environment is needed).

Inputs come from fixed seeds. Half-precision arithmetic is checked in float16: the interpreter's
tl.dot is wrong on bfloat16 operands, so bfloat16 covers loads, stores and the kernel's upcast path.
"""
from __future__ import annotations

import random

import pytest
import torch
from sarathi_kernels.kv_cache import write_kv_cache
from sarathi_kernels.paged_attention import paged_attention

from sarathi_lab.attention import make_backend, reference
from sarathi_lab.attention.triton_backend import TritonAttention
from sarathi_lab.measure.profiling.attention import context_slot_mapping, paged_batch
from tests.triton_compile import compile_for_gpu

TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}

# (query_len, seq_len): prefills first, then decodes. Covers an empty prefix with a length that is
# not a multiple of any block size, a block-aligned chunk after a prefix, a short chunk over a long
# prefix, and decodes of one token, on both sides of a block boundary and over a long context. The
# positions 126 and 62 sit two short of a 64-aligned key tile, where an off-by-one in the split
# between unmasked and masked key tiles would show.
MIXED_PREFILLS = [(37, 37), (32, 80), (5, 131)]
MIXED_DECODES = [(1, 1), (1, 33), (1, 63), (1, 200)]


@pytest.fixture(autouse=True)
def fixed_seed():
    random.seed(0)
    torch.manual_seed(0)


def make_inputs(prefills, decodes, *, heads, kv_heads, head_dim, block_size, dtype):
    """A hybrid batch whose whole context is already cached; unused cache slots hold NaN."""
    query_lens, seq_lens = (list(x) for x in zip(*prefills, *decodes))
    meta, num_blocks = paged_batch(query_lens, seq_lens, num_prefills=len(prefills), block_size=block_size)
    k_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"), dtype=dtype)
    v_cache = k_cache.clone()
    slots = context_slot_mapping(meta, block_size)
    for cache in (k_cache, v_cache):
        cache.view(-1, kv_heads, head_dim)[slots] = torch.randn(len(slots), kv_heads, head_dim).to(dtype)
    query = torch.randn(sum(query_lens), heads, head_dim).to(dtype)
    return query, k_cache, v_cache, meta


def expected(query, k_cache, v_cache, meta):
    return reference.attention(query.float(), k_cache.float(), v_cache.float(), meta, query.shape[-1] ** -0.5)


def run_kernel(query, k_cache, v_cache, meta, out=None, **tiling):
    out = torch.full_like(query, float("nan")) if out is None else out.fill_(float("nan"))
    return paged_attention(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                           query.shape[-1] ** -0.5, max_query_len=meta.max_query_len, out=out, **tiling)


def assert_close(out, ref, dtype):
    assert not out.isnan().any(), "some output elements were never written"
    err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
    assert err < TOLERANCE[dtype], f"relative error {err:.2e} >= {TOLERANCE[dtype]:.0e} for {dtype}"


def test_transformers_sees_no_kernels_package():
    from transformers.utils import is_kernels_available

    assert not is_kernels_available()


def test_registry_builds_triton_backend():
    assert isinstance(make_backend("triton", torch.device("cpu")), TritonAttention)


@pytest.mark.parametrize("dtype,block_size", [(torch.float32, 16), (torch.bfloat16, 32), (torch.float16, 16)])
def test_write_kv_matches_reference(dtype, block_size):
    kv_heads, head_dim = 2, 64
    _, k_cache, v_cache, meta = make_inputs(MIXED_PREFILLS, MIXED_DECODES, heads=kv_heads, kv_heads=kv_heads,
                                            head_dim=head_dim, block_size=block_size, dtype=dtype)
    k_cache.fill_(float("nan"))
    v_cache.fill_(float("nan"))
    key = torch.randn(len(meta.slot_mapping), kv_heads, head_dim).to(dtype)
    value = torch.randn_like(key)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    reference.write_kv(key, value, k_ref, v_ref, meta.slot_mapping)
    TritonAttention().write_kv(key, value, k_cache, v_cache, meta)
    for cache, new, ref in ((k_cache, key, k_ref), (v_cache, value, v_ref)):
        assert torch.equal(cache.view(-1, kv_heads, head_dim)[meta.slot_mapping], new)
        # Every slot outside the batch must still be NaN: nothing else was touched.
        torch.testing.assert_close(cache, ref, rtol=0, atol=0, equal_nan=True)


def test_write_kv_skips_negative_slots():
    # A CUDA graph's padded rows carry slot -1: their keys must land nowhere, the others as usual.
    kv_heads, head_dim, block_size = 2, 64, 16
    _, k_cache, v_cache, meta = make_inputs([], MIXED_DECODES, heads=kv_heads, kv_heads=kv_heads,
                                            head_dim=head_dim, block_size=block_size, dtype=torch.float32)
    # Each cache sits between two guard blocks, where a negative slot's store would land.
    k_whole, v_whole = (torch.full((len(c) + 2, *c.shape[1:]), float("nan")) for c in (k_cache, v_cache))
    k_cache, v_cache = k_whole[1:-1], v_whole[1:-1]
    slots = torch.cat([meta.slot_mapping, torch.full((20,), -1, dtype=torch.int64)])
    key = torch.randn(len(slots), kv_heads, head_dim)
    value = torch.randn_like(key)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    reference.write_kv(key[: len(meta.slot_mapping)], value[: len(meta.slot_mapping)], k_ref, v_ref,
                       meta.slot_mapping)
    write_kv_cache(key, value, k_cache, v_cache, slots)
    for whole, ref in ((k_whole, k_ref), (v_whole, v_ref)):
        torch.testing.assert_close(whole[1:-1], ref, rtol=0, atol=0, equal_nan=True)
        assert whole[[0, -1]].isnan().all(), "a padded token's key was stored outside the cache"


@pytest.mark.parametrize("dtype,block_size,heads,kv_heads,head_dim", [
    (torch.float32, 16, 4, 4, 64),
    (torch.float16, 32, 8, 2, 64),
    (torch.float32, 32, 8, 1, 128),
    (torch.float16, 16, 8, 1, 16),
    (torch.float32, 16, 6, 2, 24),  # group of 3 and head_dim 24 exercise the padded lanes
])
def test_mixed_batch_matches_reference(dtype, block_size, heads, kv_heads, head_dim):
    query, k_cache, v_cache, meta = make_inputs(MIXED_PREFILLS, MIXED_DECODES, heads=heads, kv_heads=kv_heads,
                                                head_dim=head_dim, block_size=block_size, dtype=dtype)
    assert_close(run_kernel(query, k_cache, v_cache, meta), expected(query, k_cache, v_cache, meta), dtype)


@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (8, 2), (8, 1)])
def test_decode_only_batch(heads, kv_heads):
    decodes = [(1, random.randint(1, 100)) for _ in range(5)]
    query, k_cache, v_cache, meta = make_inputs([], decodes, heads=heads, kv_heads=kv_heads, head_dim=32,
                                                block_size=16, dtype=torch.float32)
    assert_close(run_kernel(query, k_cache, v_cache, meta), expected(query, k_cache, v_cache, meta), torch.float32)


@pytest.mark.parametrize("seed", [1, 2])
def test_random_batch(seed):
    random.seed(seed)
    torch.manual_seed(seed)
    prefills = []
    for _ in range(random.randint(1, 3)):
        q_len = random.randint(1, 70)
        prefills.append((q_len, q_len + random.choice([0, random.randint(1, 90)])))
    decodes = [(1, random.randint(1, 150)) for _ in range(random.randint(0, 4))]
    print(f"prefills={prefills} decodes={decodes}")
    query, k_cache, v_cache, meta = make_inputs(prefills, decodes, heads=4, kv_heads=1, head_dim=32,
                                                block_size=16, dtype=torch.float16)
    assert_close(run_kernel(query, k_cache, v_cache, meta), expected(query, k_cache, v_cache, meta), torch.float16)


@pytest.mark.parametrize("block_m,block_n", [(16, 16), (128, 32)])
def test_tilings_that_straddle_chunks(block_m, block_n):
    query, k_cache, v_cache, meta = make_inputs(MIXED_PREFILLS, MIXED_DECODES, heads=4, kv_heads=2, head_dim=16,
                                                block_size=16, dtype=torch.float32)
    out = run_kernel(query, k_cache, v_cache, meta, block_m=block_m, block_n=block_n)
    assert_close(out, expected(query, k_cache, v_cache, meta), torch.float32)


def test_bfloat16_attention():
    query, k_cache, v_cache, meta = make_inputs(MIXED_PREFILLS, MIXED_DECODES, heads=4, kv_heads=2, head_dim=64,
                                                block_size=16, dtype=torch.bfloat16)
    assert_close(run_kernel(query, k_cache, v_cache, meta), expected(query, k_cache, v_cache, meta), torch.bfloat16)


def test_strided_query_and_out_through_backend():
    """The engine slices q out of a fused qkv projection: rows are strided, not contiguous."""
    heads, kv_heads, head_dim = 4, 2, 32
    query, k_cache, v_cache, meta = make_inputs(MIXED_PREFILLS[:2], MIXED_DECODES[1:], heads=heads,
                                                kv_heads=kv_heads, head_dim=head_dim, block_size=16,
                                                dtype=torch.float32)
    qkv = torch.randn(len(query), heads + 2 * kv_heads, head_dim)
    qkv[:, :heads] = query
    out = TritonAttention().attend(qkv[:, :heads], k_cache, v_cache, meta, head_dim ** -0.5)
    assert_close(out, expected(query, k_cache, v_cache, meta), torch.float32)
    wide = torch.empty(len(query), 2 * heads, head_dim)
    run_kernel(qkv[:, :heads], k_cache, v_cache, meta, out=wide[:, heads:])
    assert_close(wide[:, heads:], expected(query, k_cache, v_cache, meta), torch.float32)


def _bad_inputs():
    q = torch.zeros(5, 4, 16)
    k = torch.zeros(3, 16, 2, 16)
    qsl = torch.tensor([0, 5], dtype=torch.int32)
    lens = torch.tensor([5], dtype=torch.int32)
    tables = torch.zeros(1, 1, dtype=torch.int32)
    return q, k, qsl, lens, tables


@pytest.mark.parametrize("change,message", [
    (lambda q, k, qsl, lens, t: (q[0], k, qsl, lens, t), "query must be 3-D"),
    (lambda q, k, qsl, lens, t: (q.half(), k, qsl, lens, t), "must share a dtype"),
    (lambda q, k, qsl, lens, t: (q.int(), k.int(), qsl, lens, t), "query dtype must be one of"),
    (lambda q, k, qsl, lens, t: (q[..., :8], k, qsl, lens, t), "head_dim 16 differs from query head_dim 8"),
    (lambda q, k, qsl, lens, t: (q[:, :3], k, qsl, lens, t), "multiple of kv heads"),
    (lambda q, k, qsl, lens, t: (q, k, qsl.long(), lens, t), "query_start_loc must be torch.int32"),
    (lambda q, k, qsl, lens, t: (q, k, qsl[:1], lens, t), "query_start_loc needs 2 entries"),
    (lambda q, k, qsl, lens, t: (q.transpose(0, 2).contiguous().transpose(0, 2), k, qsl, lens, t),
     "query must be contiguous in its last dim"),
])
def test_attention_rejects_bad_arguments(change, message):
    q, k, qsl, lens, tables = change(*_bad_inputs())
    with pytest.raises(ValueError, match=message):
        paged_attention(q, k, k, qsl, lens, tables)


def test_write_kv_rejects_bad_arguments():
    _, k, *_ = _bad_inputs()
    key = torch.zeros(4, 2, 16)
    with pytest.raises(ValueError, match="slot_mapping must be torch.int64"):
        write_kv_cache(key, key, k, k, torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="must share a dtype"):
        write_kv_cache(key.bfloat16(), key.bfloat16(), k, k, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="does not fit cache"):
        write_kv_cache(key[:, :1], key[:, :1], k, k, torch.zeros(4, dtype=torch.long))


# Compiled (through ptxas, no GPU needed): a kernel can run interpreted and still be rejected by the compiler.
_COMPILE_FOR_SM80 = """
import triton.language as tl
from sarathi_kernels.kv_cache import _write_kv_kernel
from sarathi_kernels.paged_attention import _paged_attention_kernel
from sarathi_kernels.split_merge import _merge_splits_kernel

bf16 = dict(q_ptr="*bf16", k_cache_ptr="*bf16", v_cache_ptr="*bf16", out_ptr="*bf16", part_ptr="*fp32",
            lse_ptr="*fp32", scale_log2="fp32")
compile(_paged_attention_kernel, bf16, dict(BLOCK_SIZE=16, GROUP=4, GROUP_PAD=4, HEAD_DIM_PAD=128, BLOCK_M=64,
                                            BLOCK_N=64, DOT_DTYPE=tl.bfloat16, PRECISION=None))
compile(_merge_splits_kernel, dict(part_ptr="*fp32", lse_ptr="*fp32", out_ptr="*bf16"),
        dict(BLOCK_H=16, HEAD_DIM_PAD=128, DECODE=False, ROW_SPLITS=False))
compile(_write_kv_kernel, dict(key_ptr="*bf16", value_ptr="*bf16", k_cache_ptr="*bf16", v_cache_ptr="*bf16",
                               slot_ptr="*i64"), dict(BLOCK_SIZE=16, HEAD_DIM_PAD=128, BLOCK_T=16))
"""


def test_kernels_compile_for_a_gpu():
    done = compile_for_gpu(_COMPILE_FOR_SM80)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.e2e
def test_engine_greedy_tokens_match_torch_backend():
    from sarathi_lab import LLM

    prompts = [[random.randrange(4096) for _ in range(n)] for n in (20, 6, 9)]
    tokens = {}
    for attention in ("torch", "triton"):
        # chunk_size 16 splits the first prompt; later prompts' prefills share batches with decodes.
        llm = LLM(model="tiny", attention=attention, device="cpu", dtype="float32", chunk_size=16,
                  max_batch_size=3, warmup_iters=0)
        tokens[attention] = llm.generate(prompts, max_new_tokens=3)
    assert any(it.num_prefill_tokens and it.num_decode_tokens for it in llm.metrics.iterations), "no hybrid batch"
    assert tokens["triton"] == tokens["torch"]
