"""The engine's CUDA graphs of nano-batched (cut) batches (model/nano_graphs.py): a bucket's cut is
every batch's of that bucket, a replay's buffers hold what split_meta builds for the eager cut
forward, and the replayed engine gives the sequential engine's tokens.

No CUDA here: captures are the stand-ins of test_cuda_graphs.py (the forward run again over the same
buffers and metadata objects), the Triton kernels run in Triton's interpreter."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sarathi_kernels.attention_plan import TileConfig, WorkTiles
from sarathi_kernels.occupancy import GpuLimits
from sarathi_kernels.split_rule import SplitRule

from sarathi_lab import LLM
from sarathi_lab.attention import triton_backend
from sarathi_lab.attention.co_schedule import CoScheduleRule
from sarathi_lab.engine.tiles import GEMM_TILE
from sarathi_lab.measure.profiling.batches import SyntheticBatches
from sarathi_lab.model.cuda_graphs import MAX_GRAPH_TOKENS, CudaGraphs, token_buckets
from sarathi_lab.model.nano_batch import NO_OVERLAP, OverlapRule
from sarathi_lab.model.nano_graphs import bucket_cut, part_sizes
from tests.test_cuda_graphs import (
    BLOCK,
    CHUNK,
    MAX_BATCH,
    MAX_LEN,
    MIXED_NEW_TOKENS,
    MIXED_PROMPTS,
    engine,
    host_values,
    replayed_capture,
)
from tests.test_pod_attention import always

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # padded rows' 0/0


@settings(max_examples=500)
@given(largest=st.integers(1, 3 * MAX_GRAPH_TOKENS), min_tokens=st.integers(1, MAX_GRAPH_TOKENS),
       tokens=st.integers(2, MAX_GRAPH_TOKENS), decodes=st.integers(1, 3 * GEMM_TILE))
def test_every_batch_the_rule_cuts_is_cut_where_its_bucket_is(largest, min_tokens, tokens, decodes):
    rule, buckets = OverlapRule("nano_batch", min_tokens), token_buckets(largest)
    assume(tokens <= buckets[-1] and decodes < tokens)
    bucket = next(b for b in buckets if b >= tokens)
    at, cut = rule.cut(tokens, tokens - decodes, decodes), bucket_cut(rule, bucket)
    if cut is None:
        assert at is None, "a bucket without a cut graph holds a batch the rule cuts"
        return
    assert bucket % GEMM_TILE == 0 and 0 < cut < bucket
    if at is None:
        assert tokens < min_tokens
    elif tokens - decodes >= cut:
        assert at == cut
    else:  # its prefill ends before its bucket's cut: cut there, it runs eagerly
        assert at == tokens - decodes
    if at is not None and bucket >= 3 * GEMM_TILE and decodes <= GEMM_TILE:
        assert at == cut, "from three tiles up, a tile of decodes never moves the cut"


def no_run(forward, pool):
    """A capture that runs nothing: a replay only loads the buffers."""
    return (lambda: None), torch.zeros(MAX_GRAPH_TOKENS, 1), pool


@pytest.fixture(scope="module")
def cut_engine():
    llm = LLM(model="tiny", device="cpu", dtype="float32", attention="triton", cpu_linear="aten",
              max_batch_size=8, max_model_len=1024, chunk_size=512, warmup_iters=0, seed=0)
    runner = llm.engine.executor.runner
    runner.overlap = OverlapRule("nano_batch", min_tokens=GEMM_TILE + 1)
    graphs = CudaGraphs(runner, 8, 1024 // BLOCK, 512 + 8, no_run)
    return llm, graphs


def test_a_graph_per_bucket_cut_and_nano_batch_tiles(cut_engine):
    _, graphs = cut_engine
    assert graphs.buckets[-4:] == [256, 384, 512, 640]
    assert sorted({tuple(g) for g in graphs.record["nano_graphs"]}) == [
        (256, 128), (384, 128), (512, 256), (640, 256)]
    assert all(len(graphs.plans[g]) == 2 for g in graphs.nano.graphs)


def assert_replay_reads_split_meta(graphs: CudaGraphs, graph, prepared) -> None:
    """The buffers ``graph`` captured (views of its padded nano-batches) hold the eager cut's metadata
    (split_meta's), padding that reads nothing, and its plans' split counts."""
    captured = graphs._padded(graph).nano
    sizes = part_sizes(graph, graphs.block_tables.shape[0])
    for i, (view, part, (tokens, requests)) in enumerate(zip(captured, prepared.nano, sizes)):
        meta, got = part.meta, view.meta
        n, t, width = meta.num_prefills + meta.num_decodes, sum(meta.query_lens_host), meta.block_tables.shape[1]
        assert got.query_start_loc.shape[0] == requests + 1 and view.positions.shape[0] == tokens
        assert torch.equal(got.query_start_loc[: n + 1], meta.query_start_loc)
        assert (got.query_start_loc[n + 1 :] == t).all()
        assert torch.equal(got.seq_lens[:n], meta.seq_lens) and not got.seq_lens[n:].any()
        assert torch.equal(got.block_tables[:n, :width], meta.block_tables)
        assert torch.equal(got.slot_mapping[:t], meta.slot_mapping) and (got.slot_mapping[t:] == -1).all()
        assert torch.equal(view.positions[:t], part.positions)
        assert got.plan is graphs.plans[graph][i] and got.plan.split_counts is graphs.nano.parts[i].split_counts
        rows = [list(r) for r in meta.plan.device_rows()]
        assert graphs.nano.parts[i].split_counts[:, :4].tolist() == rows


prefills = st.lists(st.tuples(st.integers(1, 300), st.integers(0, 200)), min_size=1, max_size=3)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefills=prefills, decodes=st.integers(1, 5), context=st.integers(2, 400))
def test_a_replay_reads_the_eager_cut_s_metadata(cut_engine, prefills, decodes, context):
    llm, graphs = cut_engine
    runner = llm.engine.executor.runner
    assume(sum(c for c, _ in prefills) + decodes <= 512 + 8)
    with SyntheticBatches(llm, seed=0).made(prefills, decodes, context) as batch:
        prepared = runner.prepare(batch)
        assume(prepared.nano is not None)
        graph = graphs.graph_for(prepared)
        tokens, at = prepared.input_ids.shape[0], prepared.nano[0].tokens.stop
        bucket = next(b for b in graphs.buckets if b >= tokens)
        assert (graph is not None) == (at == bucket_cut(runner.overlap, bucket))
        if graph is None:
            return
        assert graph.tokens == bucket and graph.cut == at
        graphs.replay(prepared, graph)
        assert_replay_reads_split_meta(graphs, graph, prepared)


def test_a_batch_cut_off_its_bucket_s_cut_or_co_scheduled_runs_eagerly(cut_engine, monkeypatch):
    llm, graphs = cut_engine
    runner, batches = llm.engine.executor.runner, SyntheticBatches(llm, seed=0)
    # 140 tokens (bucket 256, cut 128): 133 prefill tokens reach the cut, 127 do not.
    for chunk, decodes, cut in ((133, 7, 128), (127, 13, 127)):
        with batches.made([(chunk, 50)], decodes, 200) as batch:
            prepared = runner.prepare(batch)
            graph = graphs.graph_for(prepared)
            assert prepared.nano[0].tokens.stop == cut
            assert (graph is not None) == (cut == 128)
    backend = runner.model.backend
    monkeypatch.setattr(backend, "hybrid", "pod")
    monkeypatch.setattr(backend, "co_schedule", CoScheduleRule.from_entries(always(1, 2, 4).co_schedule, "test"))
    with batches.made([(133, 50)], 7, 200) as batch:
        prepared = runner.prepare(batch)
        assert backend.co_schedules(prepared.nano[1].meta, graphs.num_heads, graphs.k_cache)
        assert graphs.graph_for(prepared) is None


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu-plan", "gpu-plan"])
def test_cut_graphs_replay_the_sequential_engine_s_tokens(gpu, monkeypatch):
    llm = engine("sarathi")
    if gpu:  # planned for a GPU of 8 SMs with short key tiles: balanced work in both nano-batches
        backend = llm.engine.executor.runner.model.backend
        backend.limits, backend.rule = GpuLimits(num_sms=8), SplitRule(min_key_tiles=1)
        backend.tiles = WorkTiles(TileConfig(16, 16), TileConfig(64, 16), TileConfig(128, 16, 8))
    sequential = llm.generate(MIXED_PROMPTS, max_new_tokens=MIXED_NEW_TOKENS)
    runner = llm.engine.executor.runner
    # A tile of 16 rows, so that the tiny model's hybrid batches (up to 38 tokens) are cut.
    runner.overlap = OverlapRule("nano_batch", min_tokens=17, tile=16)
    graphs = CudaGraphs(runner, MAX_BATCH, MAX_LEN // BLOCK, CHUNK + MAX_BATCH, replayed_capture)
    assert graphs.record["nano_graphs"] == [[32, 16], [48, 16]]
    replay, attend = graphs.replay, triton_backend.paged_attention
    replays, checked, calls, replaying, balanced = [], [], {}, [], []

    def checked_replay(prepared, graph):
        replays.append((graph.cut, prepared.nano is not None))
        replaying.append(graph)
        try:
            out = replay(prepared, graph)
        finally:
            replaying.pop()
        if graph.cut:
            assert_replay_reads_split_meta(graphs, graph, prepared)
            checked.append(graph)
            balanced.extend(launch.balanced is not None for part in prepared.nano
                            for launch in part.meta.plan.launches() if launch.working_tiles)
        return out

    def spied_attention(*args, **kwargs):
        if replaying:
            calls.setdefault(replaying[-1], set()).add(host_values(args, kwargs))
        return attend(*args, **kwargs)

    monkeypatch.setattr(graphs, "replay", checked_replay)
    monkeypatch.setattr(triton_backend, "paged_attention", spied_attention)
    monkeypatch.setattr(llm.engine.executor, "graphs", graphs)
    try:
        assert llm.generate(MIXED_PROMPTS, max_new_tokens=MIXED_NEW_TOKENS) == sequential
    finally:
        runner.overlap = NO_OVERLAP
    assert checked, "some cut batch replayed its cut graph"
    assert balanced and all(balanced) == gpu
    assert all(bool(cut) == nano for cut, nano in replays), "a cut batch replays only a cut graph"
    # Each nano-batch's attention gets the host values fixed at its graph's capture, whatever the batch.
    buffers = [part.split_counts for part in graphs.nano.parts]
    for graph in checked:
        assert 1 <= len(calls[graph]) <= 2, calls[graph]
        for _, kwargs in calls[graph]:
            plan = dict(kwargs)["plan"]
            assert plan in graphs.plans[graph] and any(plan.split_counts is b for b in buffers)
