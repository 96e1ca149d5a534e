"""Decode-only forwards replayed from captured graphs give the eager engine's tokens.

No CUDA here, so the capture is a stand-in with a graph's semantics: the forward captured once, over
the same buffers and the same metadata object, whose host values (lists, counts) stay those of the
capture while the buffers' contents change; the Triton kernels run in Triton's interpreter."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sarathi_lab import LLM
from sarathi_lab.config import ConfigError
from sarathi_lab.model.cuda_graphs import DecodeGraphs, graph_sizes
from sarathi_lab.profiling.batches import SyntheticBatches

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # padded rows' 0/0

MAX_BATCH, MAX_LEN, BLOCK = 6, 96, 16
PROMPTS = [[i + 1] * (5 + 7 * i) for i in range(MAX_BATCH)]
NEW_TOKENS = [3, 9, 1, 14, 6, 11]  # the decode batch shrinks as requests finish, so graphs are padded


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


def engine(scheduler: str) -> LLM:
    return LLM(model="tiny", device="cpu", dtype="float32", attention="triton", cpu_linear="aten",
               max_batch_size=MAX_BATCH, max_model_len=MAX_LEN, scheduler=scheduler, chunk_size=32,
               warmup_iters=0)


@pytest.mark.parametrize("scheduler", ["static", "sarathi"])
def test_decode_graphs_replay_the_eager_engine_s_tokens(scheduler):
    llm = engine(scheduler)
    eager = llm.generate(PROMPTS, max_new_tokens=NEW_TOKENS)
    executor = llm.engine.executor
    graphs = DecodeGraphs(executor.runner, MAX_BATCH, MAX_LEN // BLOCK, replayed_capture)
    replays, eager_decodes = [], []
    replay, forward = graphs.replay, executor.runner.forward

    def counted_replay(prepared, size):
        replays.append((prepared.meta.num_decodes, size))
        return replay(prepared, size)

    def counted_forward(prepared, argmax=False):
        replaying = prepared.input_ids.data_ptr() == graphs.input_ids.data_ptr()
        if not prepared.meta.num_prefills and not replaying:
            eager_decodes.append(prepared.meta.num_decodes)
        return forward(prepared, argmax)

    graphs.replay, executor.runner.forward, executor.graphs = counted_replay, counted_forward, graphs
    assert llm.generate(PROMPTS, max_new_tokens=NEW_TOKENS) == eager
    assert replays and not eager_decodes, "every decode-only batch replays a graph"
    assert any(n < size for n, size in replays), "some batch ran padded"
    assert sorted(graphs.graphs) == graph_sizes(MAX_BATCH)


def test_a_batch_a_graph_cannot_hold_runs_eagerly():
    llm = engine("sarathi")
    graphs = DecodeGraphs(llm.engine.executor.runner, 4, 2, replayed_capture)
    runner = llm.engine.executor.runner
    batches = SyntheticBatches(llm, seed=0)
    cases = {(0, 3, 20): 4, (0, 4, 32): 4, (0, 5, 20): None, (0, 2, 40): None, (8, 2, 20): None}
    for (chunk, decodes, context), size in cases.items():
        batch = batches.make(prefills=[(chunk, 0)] if chunk else [], decodes=decodes, context=context)
        try:
            assert graphs.size_for(runner.prepare(batch)) == size, (chunk, decodes, context)
        finally:
            batches.free(batch)


def test_graphs_only_where_they_can_replay():
    # On a CPU nothing is captured, and the run's environment says so.
    llm = LLM(model="tiny", device="cpu", dtype="float32", warmup_iters=0)
    assert llm.cuda_graphs is None and llm.engine.executor.graphs is None
    with pytest.raises(ConfigError, match="cuda_graphs='yes' is invalid"):
        LLM(model="tiny", device="cpu", cuda_graphs="yes")
