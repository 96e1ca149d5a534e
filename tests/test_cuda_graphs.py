"""Forwards replayed from captured graphs (decode-only, and mixed: prefill chunks alone or beside
decodes, whole prompts) give the eager engine's tokens.

No CUDA here, so the capture is a stand-in with a graph's semantics: the forward captured once, over
the same buffers and the same metadata object, whose host values (lists, counts, hints) stay those of
the capture while the buffers' contents change; the Triton kernels run in Triton's interpreter."""
from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sarathi_kernels.attention_plan import TileConfig, WorkTiles, plan_batch
from sarathi_kernels.occupancy import GpuLimits
from sarathi_kernels.split_rule import SplitRule

from sarathi_lab import LLM
from sarathi_lab import llm as llm_module
from sarathi_lab.attention import triton_backend
from sarathi_lab.attention.co_schedule import CoScheduleRule
from sarathi_lab.attention.triton_backend import TritonAttention
from sarathi_lab.config import ConfigError
from sarathi_lab.engine.tiles import GEMM_TILE
from sarathi_lab.measure.profiling.batches import SyntheticBatches
from sarathi_lab.model import cuda_graphs
from sarathi_lab.model.cuda_graphs import (
    MAX_GRAPH_TOKENS,
    SMALLEST_BUCKET,
    CudaGraphs,
    bucket_step,
    graph_sizes,
    token_buckets,
)
from sarathi_lab.model.nano_batch import NO_OVERLAP
from tests.test_pod_attention import always

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # padded rows' 0/0

MAX_BATCH, MAX_LEN, BLOCK, CHUNK = 6, 96, 16, 32
PROMPTS = [[i + 1] * (5 + 7 * i) for i in range(MAX_BATCH)]
# The decode batch shrinks as requests finish, so graphs are padded: static's decode-only batches are
# 5, 4, 3, 2, 1 and sarathi's (after its hybrid ones) 3, 2, 1.
NEW_TOKENS = [3, 1, 2, 6, 5, 4]
# Fewer and shorter, for the mixed graphs: one prompt longer than a chunk, chunks beside decodes.
MIXED_PROMPTS = [[i + 1] * n for i, n in enumerate((5, 40, 14, 23))]
MIXED_NEW_TOKENS = [2, 6, 1, 4]
# vllm's cap on a prefill iteration's prompt tokens, so that its whole prompts fit a few small buckets.
VLLM_CAP = 64


def replayed_capture(forward, pool):
    """A stand-in for a CUDA graph's capture: replay runs the same forward over the same inputs again."""
    out = forward()

    def replay():
        with torch.inference_mode():
            out.copy_(forward())

    return replay, out, pool


@given(st.integers(1, 600))
def test_every_decode_batch_has_a_graph_at_most_one_step_larger(max_batch):
    sizes = graph_sizes(max_batch)
    assert sizes == sorted(set(sizes)) and sizes[-1] == max_batch and sizes[0] == 1
    for n in range(1, max_batch + 1):
        size = next(s for s in sizes if s >= n)
        assert size - n < 16 and size < 2 * n, f"a batch of {n} pads to {size}"


@given(st.integers(1, 3 * MAX_GRAPH_TOKENS))
def test_every_mixed_batch_pads_within_its_last_gemm_tile(largest):
    buckets = token_buckets(largest)
    assert buckets == sorted(set(buckets)) and buckets[0] == SMALLEST_BUCKET
    assert buckets[-1] >= min(largest, MAX_GRAPH_TOKENS) and buckets[-1] <= MAX_GRAPH_TOKENS
    assert all(b % SMALLEST_BUCKET == 0 for b in buckets)
    # Powers of two below the GEMM tile, then every multiple of it: a few.
    small = [b for b in buckets[:-1] if b <= GEMM_TILE]
    assert small == [16, 32, 64, 128][:len(small)]
    assert all(b % GEMM_TILE == 0 for b in buckets if b >= GEMM_TILE)
    assert len(buckets) <= 3 + -(-buckets[-1] // GEMM_TILE)
    for below, bucket in zip([0, *buckets], buckets):
        assert bucket - below <= (bucket_step(below) if below else SMALLEST_BUCKET)
        for n in range(below + 1, bucket + 1):
            # From a tile up, a batch pads to the end of its last tile and never into another (a 273-token
            # batch runs in a graph of 384 rows: three tiles either way); below, by less than itself.
            if n > GEMM_TILE:
                assert bucket == -(-n // GEMM_TILE) * GEMM_TILE, f"{n} tokens pad to {bucket}"
            else:
                assert bucket - n < max(n, SMALLEST_BUCKET), f"{n} tokens pad to {bucket}"


def fake_runner(heads: tuple[int, int] = (4, 4), limits: GpuLimits | None = None, name: str = "triton"):
    """A runner with only what capturing needs: the backend (planning for ``limits``), the model's heads
    (query, KV) and a bf16 key cache of blocks of BLOCK tokens."""
    backend = TritonAttention(limits=limits) if name == "triton" else SimpleNamespace(name=name, replayable=False)
    cache = torch.zeros(1, BLOCK, heads[1], 128, dtype=torch.bfloat16)
    model = SimpleNamespace(backend=backend, config=SimpleNamespace(num_attention_heads=heads[0]))
    return SimpleNamespace(model=model, kv_caches=[(cache, cache)], device=torch.device("cpu"), overlap=NO_OVERLAP)


def fake_graphs(max_batch: int, max_blocks: int, mixed_tokens: int | None, heads: tuple[int, int] = (4, 4),
                limits: GpuLimits | None = None) -> CudaGraphs:
    """Graphs captured by a capture that runs nothing: their choice of graph alone."""
    return CudaGraphs(fake_runner(heads, limits), max_batch, max_blocks, mixed_tokens,
                      lambda forward, pool: (None, None, pool))


def fake_batch(tokens: int, prefills: int, decodes: int, width: int, query_lens: list[int] | None = None,
               seq_lens: list[int] | None = None) -> SimpleNamespace:
    """A batch as graph_for sees it: counts, a table ``width`` blocks wide, host lengths (default: the
    prefill tokens in one chunk, then the decodes, each as long as the table)."""
    if query_lens is None:
        query_lens = ([tokens - decodes] if prefills else []) + [1] * decodes
    seq_lens = seq_lens or [width * BLOCK] * (prefills + decodes)
    meta = SimpleNamespace(num_prefills=prefills, num_decodes=decodes, block_tables=torch.zeros(prefills + decodes,
                                                                                                width),
                           query_lens_host=query_lens, seq_lens_host=seq_lens, plan=None)
    return SimpleNamespace(input_ids=torch.zeros(tokens), meta=meta, nano=None)


@settings(max_examples=300, deadline=None)  # untimed: a loaded CPU stretches its first example
@given(max_batch=st.integers(1, 40), largest=st.integers(1, 1500), decodes=st.integers(0, 50),
       prefill_tokens=st.lists(st.integers(1, 800), max_size=4), width=st.integers(1, 12))
def test_a_batch_replays_the_smallest_graph_that_holds_it_and_else_runs_eagerly(max_batch, largest, decodes,
                                                                                 prefill_tokens, width):
    if not decodes and not prefill_tokens:
        decodes = 1
    graphs = fake_graphs(max_batch, 8, largest)
    requests, tokens = decodes + len(prefill_tokens), decodes + sum(prefill_tokens)
    batch = fake_batch(tokens, len(prefill_tokens), decodes, width, [*prefill_tokens, *[1] * decodes])
    graph = graphs.graph_for(batch)
    fits = width <= 8 and requests <= max_batch and (not prefill_tokens or tokens <= graphs.buckets[-1])
    assert (graph is not None) == fits
    if graph is None:
        return
    assert graph.decode == (not prefill_tokens)
    assert graph.tokens >= tokens and graph.requests >= requests
    smaller = [g for g in graphs.graphs if g.decode == graph.decode and g.tokens < graph.tokens]
    assert all(g.tokens < tokens or g.requests < requests for g in smaller), "not the smallest that holds it"
    assert batch.meta.plan.replays_in(graphs.plans[graph])


def test_graphs_are_captured_largest_first_into_one_pool():
    pools = []

    def capture(forward, pool):
        pools.append(pool)
        return None, None, "the pool"

    graphs = CudaGraphs(fake_runner(), 18, 4, 530, capture)
    order = list(graphs.graphs)
    assert [g.tokens for g in order] == sorted((g.tokens for g in order), reverse=True)
    assert pools == [None] + ["the pool"] * (len(order) - 1)
    mixed = sorted({g.tokens for g in order if not g.decode})
    assert mixed == token_buckets(530) == graphs.record["mixed_tokens"]
    # A bucket of 128 tokens and more holds batches whose longest chunk fills a 128-row tile and batches
    # whose longest does not: one graph for each kind of prefill tile.
    assert len(order) == graphs.record["graphs"] == len(graph_sizes(18)) + len(mixed) + sum(b >= 128 for b in mixed)
    assert graphs.record["decode_sizes"] == graph_sizes(18) == [g.tokens for g in order if g.decode][::-1]
    assert all(g.requests == min(18, g.tokens) for g in order)
    with pytest.raises(ValueError, match="attention='torch' plans each batch from host values"):
        CudaGraphs(fake_runner(name="torch"), 4, 4, 32, capture)


def engine(scheduler: str, **knobs) -> LLM:
    knobs |= {"max_num_batched_tokens": VLLM_CAP} if scheduler == "vllm" else {}
    return LLM(model="tiny", device="cpu", dtype="float32", attention="triton", cpu_linear="aten",
               max_batch_size=MAX_BATCH, max_model_len=MAX_LEN, scheduler=scheduler, chunk_size=CHUNK,
               warmup_iters=0, **knobs)


def host_values(args: tuple, kwargs: dict) -> tuple[tuple, tuple]:
    """What a captured graph fixes of a call: tensors' shapes and dtypes, every other argument's value."""
    def fixed(value):
        return (tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else value

    return tuple(map(fixed, args)), tuple((key, fixed(value)) for key, value in sorted(kwargs.items()))


def run_with_graphs(llm: LLM, graphs: CudaGraphs, monkeypatch, prompts: list[list[int]],
                    new_tokens: list[int]) -> tuple[list[list[int]], list, list, dict]:
    """``llm``'s tokens for ``prompts`` with ``graphs`` replaying; the replays (graph, tokens, requests),
    the eager forwards (prefills, tokens), and the host values of each graph's attention calls."""
    executor = llm.engine.executor
    replays, eager, attention_calls, replaying = [], [], {}, []
    replay, forward, attend = graphs.replay, executor.runner.forward, triton_backend.paged_attention

    def counted_replay(prepared, graph):
        meta = prepared.meta
        replays.append((graph, prepared.input_ids.shape[0], meta.num_prefills + meta.num_decodes))
        replaying.append(graph)
        try:
            return replay(prepared, graph)
        finally:
            replaying.pop()

    def counted_forward(prepared, argmax=False):
        if not replaying:
            eager.append((prepared.meta.num_prefills, prepared.input_ids.shape[0]))
        return forward(prepared, argmax)

    def spied_attention(*args, **kwargs):
        if replaying:
            attention_calls.setdefault(replaying[-1], set()).add(host_values(args, kwargs))
        return attend(*args, **kwargs)

    monkeypatch.setattr(graphs, "replay", counted_replay)
    monkeypatch.setattr(executor.runner, "forward", counted_forward)
    monkeypatch.setattr(triton_backend, "paged_attention", spied_attention)
    monkeypatch.setattr(executor, "graphs", graphs)
    return llm.generate(prompts, max_new_tokens=new_tokens), replays, eager, attention_calls


@pytest.mark.parametrize("scheduler", ["static", "sarathi"])
def test_decode_graphs_replay_the_eager_engine_s_tokens(scheduler, monkeypatch):
    llm = engine(scheduler)
    eager = llm.generate(PROMPTS, max_new_tokens=NEW_TOKENS)
    graphs = CudaGraphs(llm.engine.executor.runner, MAX_BATCH, MAX_LEN // BLOCK, None, replayed_capture)
    tokens, replays, eager_forwards, _ = run_with_graphs(llm, graphs, monkeypatch, PROMPTS, NEW_TOKENS)
    assert tokens == eager
    assert replays and all(g.decode for g, _, _ in replays)
    assert eager_forwards and all(prefills for prefills, _ in eager_forwards), "every decode-only batch replays"
    assert any(n < g.requests for g, _, n in replays), "some batch ran padded"
    assert sorted(g.tokens for g in graphs.graphs) == graph_sizes(MAX_BATCH) and not graphs.buckets


@pytest.mark.parametrize("scheduler", ["sarathi", "sarathi_serve", "vllm"])
def test_mixed_graphs_replay_the_eager_engine_s_tokens(scheduler, monkeypatch):
    llm = engine(scheduler)
    eager = llm.generate(MIXED_PROMPTS, max_new_tokens=MIXED_NEW_TOKENS)
    largest = llm_module.largest_iteration_tokens(llm.engine.scheduler)
    assert largest == {"vllm": MAX_LEN, "sarathi": CHUNK + MAX_BATCH, "sarathi_serve": CHUNK + MAX_BATCH}[scheduler]
    graphs = CudaGraphs(llm.engine.executor.runner, MAX_BATCH, MAX_LEN // BLOCK, largest, replayed_capture)
    tokens, replays, eager_forwards, attention = run_with_graphs(llm, graphs, monkeypatch, MIXED_PROMPTS,
                                                                 MIXED_NEW_TOKENS)
    assert tokens == eager
    assert not eager_forwards, "every batch (each within the buckets) replays a graph"
    mixed = [(g, t, n) for g, t, n in replays if not g.decode]
    assert mixed
    assert any(t < g.tokens for g, t, _ in mixed) and any(n < g.requests for g, _, n in mixed), "padded"
    if scheduler != "vllm":
        assert any(n > 1 for _, _, n in mixed), "hybrid batches (a chunk beside decodes) replay"
    # Whatever the batch, attention gets the same host values (shapes, tiling hint) from one graph:
    # a per-batch value read on the host would differ here, and a real graph would replay it stale.
    assert attention and all(len(calls) == 1 for calls in attention.values()), attention
    for graph, calls in attention.items():
        ((_, kwargs),) = calls
        assert dict(kwargs)["plan"] == graphs.plans[graph] and dict(kwargs)["plan"].split_counts is graphs.split_counts


def test_replays_split_as_the_eager_forwards_of_the_same_batches(monkeypatch):
    # Planned for a GPU of 8 SMs, with short key tiles and splits of one key tile, the tiny model's
    # batches split their KV walks: each replay must run the launches, tiles and split counts that the
    # same batch's eager forward plans (plan_batch from its host lengths), and give its tokens.
    llm = engine("sarathi")
    backend = llm.engine.executor.runner.model.backend
    backend.limits, backend.rule = GpuLimits(num_sms=8), SplitRule(min_key_tiles=1)
    backend.tiles = WorkTiles(TileConfig(16, 16), TileConfig(64, 16), TileConfig(128, 16, 8))
    eager = llm.generate(MIXED_PROMPTS, max_new_tokens=MIXED_NEW_TOKENS)
    graphs = CudaGraphs(llm.engine.executor.runner, MAX_BATCH, MAX_LEN // BLOCK, CHUNK + MAX_BATCH,
                        replayed_capture)
    replay, compared = graphs.replay, []

    def checked_replay(prepared, graph):
        out = replay(prepared, graph)
        meta = prepared.meta
        eager_plan = plan_batch(meta.query_lens_host, meta.seq_lens_host, 4, 2, element_size=4,
                                limits=backend.limits, tiles=backend.tiles, rule=backend.rule)
        planned, replayed = eager_plan.work(), graphs.replayed_plan(graph).work()
        assert {kind: replayed[kind] for kind in planned} == planned, (graph, planned, replayed)
        compared.append(most_pieces(eager_plan))
        return out

    monkeypatch.setattr(graphs, "replay", checked_replay)
    monkeypatch.setattr(llm.engine.executor, "graphs", graphs)
    assert llm.generate(MIXED_PROMPTS, max_new_tokens=MIXED_NEW_TOKENS) == eager
    assert compared and max(compared) > 1, "some replayed batch split its walk"


def test_hybrid_batches_replay_the_co_scheduled_launch_as_their_eager_forwards(monkeypatch):
    # attention_hybrid=pod: a batch with a chunk beside decodes runs one persistent launch eagerly, so
    # its replay must run that launch too, over the work lists its eager forward plans; the other
    # batches replay the planned kernels as before.
    llm = engine("sarathi", attention_hybrid="pod")
    backend = llm.engine.executor.runner.model.backend
    pod_calls, pod = [], triton_backend.pod_attention

    def spied_pod(*args, **kwargs):
        pod_calls.append(args[7])  # the work buffers
        return pod(*args, **kwargs)

    monkeypatch.setattr(triton_backend, "pod_attention", spied_pod)
    # Where a lease measured co-scheduling faster (test_co_schedule.py: never where the table is silent).
    monkeypatch.setattr(backend, "co_schedule", CoScheduleRule.from_entries(always(1, 2, 4).co_schedule, "test"))
    eager = llm.generate(MIXED_PROMPTS, max_new_tokens=MIXED_NEW_TOKENS)
    assert pod_calls, "hybrid batches co-schedule eagerly"
    graphs = CudaGraphs(llm.engine.executor.runner, MAX_BATCH, MAX_LEN // BLOCK, CHUNK + MAX_BATCH,
                        replayed_capture)
    assert graphs.pod_graphs and graphs.record["pod_graphs"] == len(graphs.buckets)
    replay, kinds = graphs.replay, []

    def checked_replay(prepared, graph):
        meta = prepared.meta
        kinds.append((graph.pod, bool(meta.num_prefills and meta.num_decodes)))
        pod_calls.clear()
        out = replay(prepared, graph)
        if graph.pod:
            planned, _ = backend._pod_plan(meta, 4, graphs.k_cache)
            work = graphs.plans[graph].work
            assert pod_calls and all(w is work for w in pod_calls), "every layer runs the graph's buffers"
            assert work.work_indptr.tolist() == planned.work_indptr
            assert work.items[: len(planned.items)].tolist() == [list(item) for item in planned.items]
        else:
            assert not pod_calls
        return out

    monkeypatch.setattr(graphs, "replay", checked_replay)
    monkeypatch.setattr(llm.engine.executor, "graphs", graphs)
    assert llm.generate(MIXED_PROMPTS, max_new_tokens=MIXED_NEW_TOKENS) == eager
    assert (True, True) in kinds and all(is_pod == hybrid for is_pod, hybrid in kinds), kinds


def most_pieces(plan) -> int:
    """The most pieces any walk of a plan's work is cut into: its balanced work's, else its split count."""
    return max((launch.balanced.work.split_capacity if launch.balanced is not None else launch.num_splits
                for launch in plan.launches() if launch.working_tiles), default=1)


@pytest.mark.parametrize("limits", [GpuLimits(num_sms=132), GpuLimits(num_sms=108, shared_bytes_per_sm=164 * 1024)],
                         ids=["h100/h200", "a100"])
@pytest.mark.parametrize("heads", [(40, 40), (32, 8)], ids=["llama-13b", "gqa-32/8"])
def test_every_bucket_replays_its_batches_eager_plans(heads, limits):
    # Pure arithmetic at the launch step's sizes (18 requests, chunks to 512 beside decodes, contexts to
    # 4K): at every bucket's padded request count, each batch a graph holds (a lone chunk of the fewest
    # or most tokens, a chunk beside decodes, several short chunks, decodes alone) finds a graph whose
    # captured launches run its eager plan as is: same tiles, room for its splits.
    max_batch, width = 18, 4096 // BLOCK
    graphs = fake_graphs(max_batch, width, 512 + 17, heads, limits)
    eager_splits = set()
    for bucket in graphs.buckets:
        requests, fewest = min(max_batch, bucket), CudaGraphs._fewest(graphs.buckets, bucket)
        shapes = [[fewest], [bucket], [max(2, fewest - (requests - 1))] + [1] * (requests - 1),
                  [bucket - (requests - 1)] + [1] * (requests - 1), [-(-fewest // requests)] * requests]
        for lens in shapes:
            if not fewest <= sum(lens) <= bucket:  # held by another bucket
                continue
            for context in (64, 1024, 4096):
                prefills = max(1, sum(q > 1 for q in lens))  # a chunk of one token is still a prefill
                batch = fake_batch(sum(lens), prefills, len(lens) - prefills, width, lens,
                                   [max(q, context) for q in lens])
                graph = graphs.graph_for(batch)
                assert graph is not None and graph.tokens == bucket, (bucket, lens, context)
                plan = batch.meta.plan
                assert plan.replays_in(graphs.plans[graph])
                eager_splits.add(most_pieces(plan))
    for size in graphs.sizes:
        for context in (64, 4096):
            batch = fake_batch(size, 0, size, width, [1] * size, [context] * size)
            assert batch.meta.plan is None and graphs.graph_for(batch).tokens == size
            eager_splits.add(most_pieces(batch.meta.plan))
    assert max(eager_splits) > 1, "the planner splits some batch of these graphs"


def test_padded_tokens_write_no_key_or_value(monkeypatch):
    # A smaller batch replayed after a larger one in the same graph: the padded tokens' slots must be
    # -1, or their keys and values would land in the slots the larger batch's tokens left there.
    llm = engine("sarathi")
    runner = llm.engine.executor.runner
    graphs = CudaGraphs(runner, MAX_BATCH, MAX_LEN // BLOCK, CHUNK + MAX_BATCH, replayed_capture)
    batches = SyntheticBatches(llm, seed=0)
    large = batches.make(prefills=[(32, 0)], decodes=5, context=20)
    small = batches.make(prefills=[(30, 0)], decodes=3, context=20)
    try:
        prepared = [runner.prepare(batch) for batch in (large, small)]
        (graph,) = {graphs.graph_for(p) for p in prepared}
        assert graph.tokens == 48 and [p.input_ids.shape[0] for p in prepared] == [37, 33]
        graphs.replay(prepared[0], graph)
        before = torch.stack([torch.stack(layer) for layer in runner.kv_caches]).flatten(4, 5).clone()
        graphs.replay(prepared[1], graph)
        after = torch.stack([torch.stack(layer) for layer in runner.kv_caches]).flatten(4, 5)
        changed = (after != before).any(-1).flatten(2, 3).any(0).any(0).nonzero().flatten()  # slots written
        assert changed.numel() and set(changed.tolist()) <= set(prepared[1].meta.slot_mapping.tolist())
    finally:
        batches.free(large)
        batches.free(small)


def test_a_batch_a_graph_cannot_hold_runs_eagerly():
    llm = engine("sarathi")
    runner = llm.engine.executor.runner
    graphs = fake_graphs(4, 2, 20)
    assert graphs.buckets == [16, 32]
    batches = SyntheticBatches(llm, seed=0)
    cases = {(0, 3, 20): (True, 4), (0, 4, 32): (True, 4), (0, 5, 20): None, (0, 2, 40): None,
             (8, 2, 20): (False, 16), (14, 2, 20): (False, 16), (15, 2, 20): (False, 32), (8, 4, 20): None,
             (31, 1, 20): (False, 32), (32, 1, 20): None, (8, 2, 40): None}
    for (chunk, decodes, context), want in cases.items():
        batch = batches.make(prefills=[(chunk, 0)] if chunk else [], decodes=decodes, context=context)
        try:
            graph = graphs.graph_for(runner.prepare(batch))
            assert (graph and (graph.decode, graph.tokens)) == want, (chunk, decodes, context)
        finally:
            batches.free(batch)


@pytest.mark.parametrize("mixed", [True, False])
def test_the_engine_captures_what_its_config_says(mixed, monkeypatch):
    # On a CPU nothing can be captured, so the engine is made to capture with the stand-in: the knob
    # reaches the graphs, and the run's environment record says what was captured.
    monkeypatch.setattr(cuda_graphs, "can_replay", lambda backend, device: backend.name == "triton")
    monkeypatch.setattr(cuda_graphs, "CudaGraphs", functools.partial(CudaGraphs, capture=replayed_capture))
    llm = LLM(model="tiny", device="cpu", dtype="float32", attention="triton", cpu_linear="aten", max_batch_size=4,
              max_model_len=64, chunk_size=16, warmup_iters=0, cuda_graphs_mixed=mixed)
    record = llm.cuda_graphs
    assert record["decode_sizes"] == [1, 2, 4] and record["mixed_tokens"] == ([16, 32] if mixed else [])
    assert record["capture_s"] >= 0 and record["pool_bytes"] is None  # memory: only on CUDA
    assert llm.generate([[3] * 20], max_new_tokens=2)


def test_graphs_only_where_they_can_replay():
    # On a CPU nothing is captured, and the run's environment says so.
    llm = LLM(model="tiny", device="cpu", dtype="float32", warmup_iters=0)
    assert llm.cuda_graphs is None and llm.engine.executor.graphs is None
    with pytest.raises(ConfigError, match="cuda_graphs='yes' is invalid"):
        LLM(model="tiny", device="cpu", cuda_graphs="yes")
    with pytest.raises(ConfigError, match="cuda_graphs_mixed=1 is invalid: must be of type bool"):
        LLM(model="tiny", device="cpu", cuda_graphs_mixed=1)
