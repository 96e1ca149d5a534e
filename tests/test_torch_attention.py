"""The torch backend (the optimised CPU path) against attention/reference.py, on both of its paths:
the C++ paged-attention kernels, and sdpa (prefills over gathered contexts, decodes over gathered
groups and block runs read in place)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sarathi_kernels import cpu_attention

from sarathi_lab.attention import AttentionMetadata, reference
from sarathi_lab.attention.torch_backend import TorchAttention
from sarathi_lab.measure.profiling.attention import context_slot_mapping, paged_batch

DECODE_PATHS = [False, pytest.param(True, marks=pytest.mark.skipif(not cpu_attention.available(),
                                                                    reason="the CPU kernels did not build here"))]


def served_decodes(kv_heads: int, heads: int = 4, d: int = 8, bs: int = 16):
    """Decodes whose tables look as a served run leaves them: a prompt's run of consecutive blocks,
    then blocks added one at a time, anywhere."""
    gen = torch.Generator().manual_seed(0)
    num_blocks = 400
    lens = [300, 17, 129, 200, 160]
    tables, start = [], 0
    for n, prompt_blocks in zip(lens, [0, 1, 9, 12, 10]):
        table = list(range(start, start + prompt_blocks))
        start += prompt_blocks
        table += [int(b) for b in torch.randperm(num_blocks - 200, generator=gen)[: -(-n // bs) - prompt_blocks] + 200]
        tables.append(table)
    width = max(map(len, tables))
    meta = AttentionMetadata(
        num_prefills=0, num_decodes=len(lens), num_prefill_tokens=0,
        query_start_loc=torch.arange(len(lens) + 1, dtype=torch.int32), seq_lens=torch.tensor(lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        slot_mapping=torch.zeros(len(lens), dtype=torch.long), query_lens_host=[1] * len(lens), seq_lens_host=lens,
        max_query_len=1)
    # Unwritten slots (each request's last block past its length, unused blocks) hold NaN.
    k_cache = torch.full((num_blocks, bs, kv_heads, d), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    slots = context_slot_mapping(meta, bs)
    k_cache.view(-1, kv_heads, d)[slots] = torch.randn(len(slots), kv_heads, d, generator=gen)
    v_cache.view(-1, kv_heads, d)[slots] = torch.randn(len(slots), kv_heads, d, generator=gen)
    return torch.randn(len(lens), heads, d, generator=gen), k_cache, v_cache, meta


@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("cpu_kernel", DECODE_PATHS)
def test_served_decodes_match_reference(kv_heads, cpu_kernel):
    query, k_cache, v_cache, meta = served_decodes(kv_heads)
    backend = TorchAttention(cpu_kernel=cpu_kernel)
    backend.plan(meta, k_cache)
    assert meta.plan.kernel == cpu_kernel
    assert bool(meta.plan.decodes.runs) != cpu_kernel, "the sdpa path read no block run in place"
    got = backend.attend(query, k_cache, v_cache, meta, 8**-0.5)
    torch.testing.assert_close(got, reference.attention(query, k_cache, v_cache, meta, 8**-0.5), rtol=1e-5,
                               atol=1e-5)


def test_plan_is_built_once_and_shared_by_every_layer():
    query, k_cache, v_cache, meta = served_decodes(2)
    backend = TorchAttention(cpu_kernel=False)
    backend.plan(meta, k_cache)
    plan = meta.plan
    first = backend.attend(query, k_cache, v_cache, meta, 0.3)
    # Another layer (another cache of the same layout) reuses the plan; a second backend, holding
    # nothing from the first, reads the same.
    layer2 = k_cache.flip(0).contiguous(), v_cache.flip(0).contiguous()
    backend.attend(query, *layer2, meta, 0.3)
    assert meta.plan is plan
    torch.testing.assert_close(TorchAttention(cpu_kernel=False).attend(query, k_cache, v_cache, meta, 0.3), first,
                               rtol=0, atol=0)


@settings(max_examples=30, deadline=None)
@given(prefills=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 200)), max_size=3),
       decodes=st.lists(st.integers(1, 400), max_size=6), block_size=st.sampled_from([1, 4, 16]),
       kv_heads=st.sampled_from([1, 2]), group=st.sampled_from([1, 3]), head_dim=st.sampled_from([8, 24]),
       cpu_kernel=st.booleans(), contiguous_tables=st.booleans(), seed=st.integers(0, 2**16))
# Two decodes of one padded sdpa group (20 and 21 keys): the shorter one's 21st slot is unwritten.
@example(prefills=[], decodes=[20, 21], block_size=16, kv_heads=1, group=1, head_dim=8, cpu_kernel=False,
         contiguous_tables=False, seed=0)
def test_hybrid_batches_match_reference(prefills, decodes, block_size, kv_heads, group, head_dim, cpu_kernel,
                                        contiguous_tables, seed):
    """Any hybrid batch, on tables scattered at random or laid out in consecutive blocks, whose long
    runs (>= MIN_RUN blocks) the sdpa path reads in place."""
    if not (prefills or decodes):
        return
    torch.manual_seed(seed)
    query_lens = [q for q, _ in prefills] + [1] * len(decodes)
    seq_lens = [q + prefix for q, prefix in prefills] + decodes
    tables = None
    if contiguous_tables:
        need = [-(-n // block_size) for n in seq_lens]
        starts = torch.tensor([0, *need]).cumsum(0).tolist()
        tables = torch.zeros(len(need), max(need), dtype=torch.int32)
        for i, n in enumerate(need):
            tables[i, :n] = torch.arange(starts[i], starts[i] + n)
    meta, num_blocks = paged_batch(query_lens, seq_lens, num_prefills=len(prefills), block_size=block_size,
                                   block_tables=tables)
    # Only the contexts' slots hold keys; every other slot (the tail of a request's last block, the
    # spare block) holds NaN, which no path may read: the reference never does, and a cache block
    # keeps whatever its previous owner left (float16 overflow leaves inf, and inf * 0 is NaN).
    k_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    slots = context_slot_mapping(meta, block_size)
    k_cache.view(-1, kv_heads, head_dim)[slots] = torch.randn(len(slots), kv_heads, head_dim)
    v_cache.view(-1, kv_heads, head_dim)[slots] = torch.randn(len(slots), kv_heads, head_dim)
    query = torch.randn(sum(query_lens), kv_heads * group, head_dim)
    scale = head_dim**-0.5
    got = TorchAttention(cpu_kernel=cpu_kernel).attend(query, k_cache, v_cache, meta, scale)
    torch.testing.assert_close(got, reference.attention(query, k_cache, v_cache, meta, scale), rtol=1e-5,
                               atol=1e-5)
