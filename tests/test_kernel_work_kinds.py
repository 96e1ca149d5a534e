"""The Triton paged attention planned per work kind (attention_plan.plan_batch): decode tiles over the
decodes of a hybrid batch, prefill tiles of 64 rows or tall ones of 128 on 8 warps over its
chunks (their last tile first), each launch split as the plan says, equal to attention/reference.py in
Triton's interpreter; and so is a CUDA graph's launch (plan_graph), captured with room for more splits
than the batch it replays is given, with spare requests of context 0."""
from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sarathi_kernels.attention_plan import TileConfig, WorkTiles, plan_batch, plan_graph
from sarathi_kernels.occupancy import GpuLimits
from sarathi_kernels.paged_attention import paged_attention
from sarathi_kernels.split_merge import split_counts_buffer
from sarathi_kernels.split_rule import SplitRule

from sarathi_lab.attention.triton_backend import TritonAttention
from tests.test_kernel_splits import with_padding_rows
from tests.test_kernels import assert_close, expected, make_inputs

# Short key tiles and a rule that splits walks of one key tile, so that the interpreter's small
# batches split; the tall tiles are the defaults' (128 rows, 8 warps).
TILES = WorkTiles(decode=TileConfig(16, 16), prefill=TileConfig(64, 16), tall_prefill=TileConfig(128, 16, 8))
RULE = SplitRule(min_key_tiles=1)


def run(query, k_cache, v_cache, starts, seq_lens, tables, plan):
    out = torch.full_like(query, float("nan"))
    return paged_attention(query, k_cache, v_cache, starts, seq_lens, tables, query.shape[-1] ** -0.5, plan=plan,
                           out=out)


@settings(max_examples=10, deadline=None)
@given(chunks=st.lists(st.tuples(st.integers(2, 140), st.integers(0, 90)), min_size=0, max_size=2),
       decodes=st.lists(st.integers(1, 120), max_size=3), heads=st.sampled_from([(2, 2), (4, 1), (4, 2)]),
       num_sms=st.sampled_from([1, 2, 8]), seed=st.integers(0, 2**16))
# A tall chunk beside a short one and decodes, split; a lone 64-row tile chunk; decodes alone.
@example(chunks=[(130, 20), (9, 40)], decodes=[1, 70], heads=(2, 2), num_sms=1, seed=0)
@example(chunks=[(33, 50)], decodes=[], heads=(4, 1), num_sms=2, seed=1)
@example(chunks=[], decodes=[5, 90, 17], heads=(4, 2), num_sms=1, seed=2)
def test_every_work_kind_matches_reference(chunks, decodes, heads, num_sms, seed):
    if not chunks and not decodes:
        decodes = [3]
    torch.manual_seed(seed)
    num_heads, num_kv_heads = heads
    query, k_cache, v_cache, meta = make_inputs([(c, p + c) for c, p in chunks], [(1, n) for n in decodes],
                                                heads=num_heads, kv_heads=num_kv_heads, head_dim=16, block_size=16,
                                                dtype=torch.float32)
    plan = plan_batch(meta.query_lens_host, meta.seq_lens_host, num_heads, num_kv_heads, element_size=4,
                      limits=GpuLimits(num_sms=num_sms), tiles=TILES, rule=RULE)
    assert (plan.decode is not None) == bool(decodes) and (plan.prefill is not None) == bool(chunks)
    out = run(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables, plan)
    assert_close(out, expected(query, k_cache, v_cache, meta), torch.float32)


def test_tall_tiles_where_a_chunk_fills_one():
    plan = plan_batch([130, 9, 1], [150, 40, 70], 2, 2, tiles=TILES)
    assert plan.prefill.tiles == TileConfig(128, 16, 8) and plan.prefill.end_request == 2
    assert plan.decode.tiles == TileConfig(16, 16) and (plan.decode.first_request, plan.decode.working_tiles) == (2, 1)
    # Under GQA a tile's rows are tokens x the padded group: 32 tokens of a group of 4 fill 128 rows.
    assert plan_batch([32], [32], 8, 2, tiles=TILES).prefill.block_q == 32
    assert plan_batch([31], [31], 8, 2, tiles=TILES).prefill.tiles == TileConfig(64, 16)


@pytest.mark.parametrize("chunk,decodes,pad", [(70, [1, 40], 2), (130, [], 1), (5, [60, 3], 0)])
def test_a_graph_s_launches_match_reference_at_the_batch_s_split_counts(chunk, decodes, pad):
    # The graph's launches are captured for more tokens' grid and more splits than this batch gets; the
    # batch's own split counts, copied into the graph's device integers, decide what runs.
    torch.manual_seed(0)
    query, k_cache, v_cache, meta = make_inputs([(chunk, chunk + 30)], [(1, n) for n in decodes], heads=2,
                                                kv_heads=2, head_dim=16, block_size=16, dtype=torch.float32)
    padded, starts, seq_lens, tables = with_padding_rows(query, meta, pad)
    limits = GpuLimits(num_sms=8)
    eager = plan_batch(meta.query_lens_host, meta.seq_lens_host, 2, 2, element_size=4, limits=limits, tiles=TILES,
                       rule=RULE)
    counts = split_counts_buffer(2, query.device)
    graph = plan_graph(len(padded), len(seq_lens), 2, 2, max_seq_len=tables.shape[1] * 16,
                       prefill_tiles=eager.prefill_tiles or TILES.prefill, element_size=4, limits=limits,
                       tiles=TILES, rule=RULE, split_counts=counts)
    assert eager.replays_in(graph)
    # Something splits: a flat launch's count below its graph's room, or the chunks' balanced work.
    assert any(captured.split_capacity > launch.num_splits > 1 for launch in eager.launches()
               for captured in graph.launches() if captured.kind == launch.kind) \
        or eager.prefill.balanced.work.split_capacity > 1
    run(padded, k_cache, v_cache, starts, seq_lens, tables, graph)  # the capture: its buffers made
    TritonAttention.set_split_counts(counts, eager, graph)  # the batch's counts and balanced work
    out = run(padded, k_cache, v_cache, starts, seq_lens, tables, graph)
    assert_close(out[: len(query)], expected(query, k_cache, v_cache, meta), torch.float32)
