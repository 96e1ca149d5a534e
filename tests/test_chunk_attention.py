"""Chunk attention without a tail wave (chunk_plan.py, chunk_attention.py): the balanced plan covers
every key of every (q-tile, KV head) walk once; the persistent kernel over it, split walks merged,
equals attention/reference.py in Triton's interpreter over chunks, prefixes, heads (MHA, GQA) and
grids; at the attention step's shapes its critical path beats today's grid and is within 1.1x of
its own work spread over the slots; it compiles for Hopper without spills."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sarathi_kernels.attention_plan import default_tiles, plan_launch, prefill_tiles_for, wave_of
from sarathi_kernels.chunk_attention import ChunkBuffers, chunk_attention
from sarathi_kernels.chunk_plan import FLAT_WAVES, grid_path, piece_cap, plan_chunks, tile_walks
from sarathi_kernels.occupancy import H100, GpuLimits

from tests.test_kernels import assert_close, expected, make_inputs
from tests.triton_compile import compile_for_gpu

A100 = GpuLimits(num_sms=108, shared_bytes_per_sm=164 * 1024)


def run_balanced(query, k_cache, v_cache, meta, *, programs, block_m, block_n):
    heads, kv_heads = query.shape[1], k_cache.shape[2]
    group_pad = 1 << (heads // kv_heads - 1).bit_length()
    query_lens = (meta.query_start_loc[1:] - meta.query_start_loc[:-1]).tolist()
    work = plan_chunks(query_lens, meta.seq_lens.tolist(), kv_heads, block_m // group_pad, block_n, programs)
    # Buffers larger than the plan, as a graph's are: rows past its lists must never be read.
    buffers = ChunkBuffers(work.programs + 2, len(work.items) + 5, query.shape[0] + 3, kv_heads,
                           max(work.split_capacity, 2), query.device)
    buffers.items.fill_(-1)
    buffers.load(work, len(query_lens))
    out = torch.full_like(query, float("nan"))
    chunk_attention(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables, buffers,
                    query.shape[-1] ** -0.5, out, group_pad=group_pad, block_m=block_m, block_n=block_n,
                    split=work.split_capacity > 1)
    return out, work


@settings(max_examples=10, deadline=None)
@given(chunks=st.lists(st.tuples(st.integers(2, 40), st.integers(0, 150)), min_size=1, max_size=2),
       heads=st.sampled_from([(2, 2), (4, 1), (4, 2), (6, 2)]), block_size=st.sampled_from([16, 32]),
       block_n=st.sampled_from([16, 32]), programs=st.integers(1, 9), seed=st.integers(0, 2**16))
# A chunk over a long prefix on more programs than its walks: each walk cut into pieces.
@example(chunks=[(20, 150)], heads=(4, 2), block_size=16, block_n=16, programs=9, seed=0)
@example(chunks=[(33, 100), (5, 0)], heads=(4, 1), block_size=32, block_n=16, programs=3, seed=1)
def test_balanced_chunks_match_reference(chunks, heads, block_size, block_n, programs, seed):
    torch.manual_seed(seed)
    query, k_cache, v_cache, meta = make_inputs([(c, p + c) for c, p in chunks], [], heads=heads[0],
                                                kv_heads=heads[1], head_dim=16, block_size=block_size,
                                                dtype=torch.float32)
    out, _ = run_balanced(query, k_cache, v_cache, meta, programs=programs, block_m=16, block_n=block_n)
    assert_close(out, expected(query, k_cache, v_cache, meta), torch.float32)


def test_a_cut_walk_in_half_precision():
    query, k_cache, v_cache, meta = make_inputs([(20, 200)], [], heads=4, kv_heads=2, head_dim=32, block_size=16,
                                                dtype=torch.bfloat16)
    out, work = run_balanced(query, k_cache, v_cache, meta, programs=8, block_m=16, block_n=16)
    assert work.split_capacity > 1
    assert_close(out, expected(query, k_cache, v_cache, meta), torch.bfloat16)


@settings(max_examples=60, deadline=None)
@given(chunks=st.lists(st.tuples(st.integers(1, 600), st.integers(0, 4000)), min_size=1, max_size=4),
       kv_heads=st.sampled_from([1, 8, 40]), block_q=st.sampled_from([16, 64, 128]),
       programs=st.integers(1, 300))
def test_the_plan_covers_every_walk_once(chunks, kv_heads, block_q, programs):
    query_lens, seq_lens = [c for c, _ in chunks], [c + p for c, p in chunks]
    work = plan_chunks(query_lens, seq_lens, kv_heads, block_q, 64, programs)
    req, first_q, keys = tile_walks(query_lens, seq_lens, block_q, 64)
    items = work.items
    covered = {}
    for r, h, q, lo, hi, split, splits, _ in items.tolist():
        covered.setdefault((r, q, h), []).append((lo, hi, split, splits))
    assert len(covered) == len(req) * kv_heads
    for t in range(len(req)):
        for h in range(kv_heads):
            pieces = sorted(covered[int(req[t]), int(first_q[t]), h])
            assert [lo for lo, *_ in pieces] == [0] + [hi for _, hi, *_ in pieces[:-1]]
            assert pieces[-1][1] == keys[t] * 64 and [s for _, _, s, _ in pieces] == list(range(len(pieces)))
            assert all(n == len(pieces) for *_, n in pieces)
    assert work.work_indptr[0] == 0 and work.work_indptr[-1] == len(items)
    assert np.all(np.diff(work.work_indptr) >= 0)
    # What a graph's buffers must hold: a piece more a program than the walks, or two waves of shares.
    assert len(items) <= max(len(req) * kv_heads + programs - 1, FLAT_WAVES * programs)
    assert work.programs <= max(len(req) * kv_heads, FLAT_WAVES * programs)
    assert work.row_splits.shape == (sum(query_lens), kv_heads)


def attention_step_shapes():
    """The attention step's chunk shapes: (chunk, prefix)."""
    return [(c, prefix) for c in (64, 128, 256, 512) for prefix in (0, 1024, 3072)]


@pytest.mark.parametrize("limits", [H100, A100], ids=["h100", "a100"])
@pytest.mark.parametrize("heads,kv_heads", [(40, 40), (32, 8)], ids=["llama-13b", "gqa-32/8"])
def test_no_tail_wave_at_the_attention_step_s_shapes(heads, kv_heads, limits):
    # Units: key tiles walked, a piece's fixed costs counted. Today's grid: a program per walk (or
    # per each of the split rule's shares of it), longest first onto the first free slot.
    tiles, group_pad = default_tiles(), 1 << (heads // kv_heads - 1).bit_length()
    off = []
    for c, prefix in attention_step_shapes():
        config = prefill_tiles_for(c, group_pad, tiles)
        slots = wave_of("prefill", config, limits)
        block_q = config.block_m // group_pad
        splits = plan_launch(c, 1, heads, kv_heads, max_seq_len=prefix + c, max_query_len=c, limits=limits).num_splits
        work = plan_chunks([c], [prefix + c], kv_heads, block_q, config.block_n, slots, max_pieces=piece_cap(c))
        today = grid_path([c], [prefix + c], kv_heads, block_q, config.block_n, slots, splits)
        planned_work = work.planned_cost / slots
        # Within 1.1x of its own work a slot wherever a prefix makes the walks long (a chunk at prefix
        # 0 is a few key tiles a walk, its whole launch a few microseconds), never slower than today.
        balanced = not prefix or work.critical_path <= 1.1 * max(planned_work, work.longest_piece)
        if work.critical_path > today or not balanced:
            off.append(f"c={c},prefix={prefix}: plan {work.critical_path:.1f}, today {today:.1f}, its work a "
                       f"slot {planned_work:.1f}")
    assert not off, "; ".join(off)


@pytest.mark.parametrize("prefix,today,planned", [(1024, 1.5, 1.15), (3072, 1.55, 1.1)])
def test_the_issue_s_chunk_runs_in_one_balanced_wave(prefix, today, planned):
    # LLaMA-13B, c=512 over a 1K/3K prefix on an H100: 160 tall tiles on 132 slots, whose grid today
    # runs a second wave of 28; the plan, its split costs counted, against the unsplit work a slot.
    c = 512
    work = plan_chunks([c], [prefix + c], 40, 128, 64, 132)
    assert grid_path([c], [prefix + c], 40, 128, 64, 132) / work.ideal >= today
    assert work.critical_path / work.ideal <= planned and work.programs == 132


# Compiled for Hopper (through ptxas, no GPU needed), aligned as an engine launch is: spilled registers.
_SPILLS = """
import json
import triton.language as tl
from sarathi_kernels.chunk_attention import _chunk_attention_kernel as chunk

aligned = [n for n in chunk.arg_names if n.endswith("_ptr") or n.startswith("stride") or n == "head_dim"]
types = dict(q_ptr="*bf16", k_cache_ptr="*bf16", v_cache_ptr="*bf16", out_ptr="*bf16", part_ptr="*fp32",
             lse_ptr="*fp32", scale_log2="fp32")
found = {}
# The decode tiles too: the decodes' balanced work runs on this kernel.
for block_m, warps, group in ((64, 4, 1), (64, 4, 4), (128, 8, 1), (128, 8, 4), (16, 4, 1), (16, 4, 4)):
    kernel = compile(chunk, types, dict(BLOCK_SIZE=16, GROUP=group, GROUP_PAD=group, HEAD_DIM_PAD=128,
                                        BLOCK_M=block_m, BLOCK_N=64, DOT_DTYPE=tl.bfloat16, PRECISION=None,
                                        ITEM_FIELDS=8), arch=90, aligned=aligned, num_warps=warps)
    found[f"chunk m={block_m} warps={warps} group={group}"] = (*spill_bytes(kernel, 90), kernel.metadata.shared)
print(json.dumps(found))
"""


@pytest.mark.slow
def test_balanced_kernel_compiles_for_hopper_without_spills():
    done = compile_for_gpu(_SPILLS)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert {name: spilled for name, (_, spilled, _) in found.items() if spilled} == {}, found
    # The decodes' wave (attention_plan.wave_of) is the paged kernel's decode tiles' residency: this
    # kernel on those tiles must fit as many CTAs a SM.
    from sarathi_kernels.occupancy import KernelResources, kernel_resources, resident_ctas

    table = resident_ctas(kernel_resources("decode", 16, 4), H100)
    for group in (1, 4):
        registers, _, shared = found[f"chunk m=16 warps=4 group={group}"]
        assert resident_ctas(KernelResources(registers, shared, 4), H100) >= table, found


def _hybrid(seed: int):
    torch.manual_seed(seed)
    return make_inputs([(40, 300), (9, 20)], [(1, 70), (1, 5)], heads=4, kv_heads=2, head_dim=16, block_size=16,
                       dtype=torch.float32)


def test_the_engine_s_plan_runs_the_chunks_balanced_on_a_gpu():
    from sarathi_kernels.attention_plan import plan_batch
    from sarathi_kernels.paged_attention import paged_attention

    query, k_cache, v_cache, meta = _hybrid(0)
    plan = plan_batch(meta.query_lens_host, meta.seq_lens_host, 4, 2, num_prefills=2, element_size=4,
                      limits=GpuLimits(num_sms=8))
    assert plan.prefill.balanced is not None and plan.prefill.balanced.work.split_capacity > 1
    out = torch.full_like(query, float("nan"))
    paged_attention(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables, 16 ** -0.5,
                    plan=plan, out=out)
    assert_close(out, expected(query, k_cache, v_cache, meta), torch.float32)


def test_a_graph_s_launch_runs_each_replay_s_balanced_work():
    # Captured once (its buffers made on its first run, over no work), then each batch's work copied in.
    from sarathi_kernels.attention_plan import plan_batch, plan_graph
    from sarathi_kernels.paged_attention import paged_attention
    from sarathi_kernels.split_merge import split_counts_buffer

    from sarathi_lab.attention.triton_backend import TritonAttention

    limits, counts = GpuLimits(num_sms=8), split_counts_buffer(2, torch.device("cpu"))
    query, k_cache, v_cache, meta = _hybrid(1)
    first = plan_batch(meta.query_lens_host, meta.seq_lens_host, 4, 2, num_prefills=2, element_size=4, limits=limits)
    graph = plan_graph(64, 6, 4, 2, max_seq_len=meta.block_tables.shape[1] * 16,
                       prefill_tiles=first.prefill.tiles, fewest_tokens=33, element_size=4, limits=limits,
                       split_counts=counts)
    paged_attention(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables, 16 ** -0.5,
                    plan=graph)
    for seed in (2, 3):
        query, k_cache, v_cache, meta = _hybrid(seed)
        plan = plan_batch(meta.query_lens_host, meta.seq_lens_host, 4, 2, num_prefills=2, element_size=4,
                          limits=limits)
        assert plan.replays_in(graph)
        TritonAttention.set_split_counts(counts, plan, graph)
        out = torch.full_like(query, float("nan"))
        paged_attention(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                        16 ** -0.5, plan=graph, out=out)
        assert_close(out, expected(query, k_cache, v_cache, meta), torch.float32)


def _same_work(a, b) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("items", "work_indptr", "row_splits")) \
        and (a.split_capacity, a.critical_path) == (b.split_capacity, b.critical_path)


@settings(max_examples=30, deadline=None)
@given(chunks=st.lists(st.tuples(st.integers(1, 300), st.integers(0, 2000)), min_size=1, max_size=3),
       other=st.lists(st.tuples(st.integers(1, 300), st.integers(0, 2000)), min_size=1, max_size=3),
       kv_heads=st.sampled_from([1, 8]), programs=st.integers(1, 200))
def test_a_repeated_signature_plans_once_and_others_plan_their_own(chunks, other, kv_heads, programs):
    from sarathi_kernels import chunk_plan

    chunk_plan._CHUNK_PLANS.clear()
    calls = []
    real = chunk_plan._work
    batches = [([c for c, _ in lens], [c + p for c, p in lens]) for lens in (chunks, other, chunks)]
    own = [chunk_plan.plan_chunks(q, s, kv_heads, 64, 64, programs) for q, s in batches]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(chunk_plan, "_work", lambda *a, **k: calls.append(a) or real(*a, **k))
        for (query_lens, seq_lens), planned in zip(batches, own):
            work = chunk_plan.cached_chunks(query_lens, seq_lens, kv_heads, 64, 64, programs)
            # A hit is the plan this batch's own planning makes; a miss of another signature too.
            assert _same_work(work, planned)
    same = [c for c, _ in chunks] == [c for c, _ in other] and \
        tile_walks(*zip(*[(c, c + p) for c, p in chunks]), 64, 64)[2].tolist() == \
        tile_walks(*zip(*[(c, c + p) for c, p in other]), 64, 64)[2].tolist()
    assert len(calls) == (1 if same else 2)


def test_the_chunk_plan_cache_is_bounded(monkeypatch):
    from sarathi_kernels import chunk_plan

    monkeypatch.setattr(chunk_plan, "MAX_CACHED_CHUNK_PLANS", 3)
    chunk_plan._CHUNK_PLANS.clear()
    for c in range(1, 8):
        chunk_plan.cached_chunks([c * 64], [c * 64 + 100], 8, 64, 64, 132)
    assert len(chunk_plan._CHUNK_PLANS) == 3
    first = chunk_plan.cached_chunks([5 * 64], [5 * 64 + 100], 8, 64, 64, 132)  # kept: among the last 3
    assert first is chunk_plan.cached_chunks([5 * 64], [5 * 64 + 100], 8, 64, 64, 132)


@settings(max_examples=8, deadline=None)
@given(prefill=st.sampled_from([None, (9, 20)]), decodes=st.lists(st.integers(1, 200), min_size=1, max_size=6),
       heads=st.sampled_from([(2, 2), (4, 1), (4, 2)]), num_sms=st.integers(1, 6), seed=st.integers(0, 2**16))
# Decodes a few walks past a whole wave (8 walks on 6 slots): the walks past it cut over the slots.
@example(prefill=None, decodes=[150, 120, 90, 64], heads=(4, 2), num_sms=2, seed=0)
def test_balanced_decodes_match_reference(prefill, decodes, heads, num_sms, seed):
    # The decodes' balanced work as the engine plans it on a GPU of a few SMs (their pieces read the
    # query and cache of the decodes only, after any chunk's rows).
    from sarathi_kernels.attention_plan import plan_batch
    from sarathi_kernels.paged_attention import paged_attention

    torch.manual_seed(seed)
    query, k_cache, v_cache, meta = make_inputs([prefill] if prefill else [], [(1, n) for n in decodes],
                                                heads=heads[0], kv_heads=heads[1], head_dim=16, block_size=16,
                                                dtype=torch.float32)
    plan = plan_batch(meta.query_lens_host, meta.seq_lens_host, *heads, num_prefills=1 if prefill else 0,
                      element_size=4, limits=GpuLimits(num_sms=num_sms))
    assert plan.decode.balanced is not None
    out = torch.full_like(query, float("nan"))
    paged_attention(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables, 16 ** -0.5,
                    plan=plan, out=out)
    assert_close(out, expected(query, k_cache, v_cache, meta), torch.float32)


@settings(max_examples=60, deadline=None)
@given(contexts=st.lists(st.integers(1, 8000), min_size=1, max_size=70), kv_heads=st.sampled_from([1, 8, 40]),
       first=st.integers(0, 3), programs=st.integers(1, 600))
def test_the_decode_plan_covers_every_walk_once(contexts, kv_heads, first, programs):
    from sarathi_kernels.chunk_plan import plan_decodes

    work = plan_decodes(contexts, kv_heads, 64, programs, first_request=first, first_token=5 * first)
    pieces = {}
    for r, h, q, lo, hi, split, splits, _ in work.items.tolist():
        assert q == 0
        pieces.setdefault((r, h), []).append((lo, hi, split, splits))
    assert sorted(pieces) == [(first + r, h) for r in range(len(contexts)) for h in range(kv_heads)]
    for (r, h), walk in pieces.items():
        walk.sort()
        assert [lo for lo, *_ in walk] == [0] + [hi for _, hi, *_ in walk[:-1]]
        assert walk[-1][1] == -(-contexts[r - first] // 64) * 64 and [s for *_, s, _ in walk] == list(
            range(len(walk)))
        # The merge reads each decode token's row: the chunks' rows before them stay whole.
        assert work.row_splits[5 * first + r - first, h] == len(walk)
    assert (work.row_splits[: 5 * first] == 1).all() and len(work.row_splits) == 5 * first + len(contexts)
    assert len(work.items) <= max(len(contexts) * kv_heads + programs - 1, FLAT_WAVES * programs)
