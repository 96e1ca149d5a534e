"""The engine loop with several micro-batches in flight, in one process: a pipeline executor that runs
each batch only when its tokens are collected (as a pipeline hands them back, after the engine has
scheduled the next ones) over the real single-process model. Under every scheduler the greedy tokens
are the one-batch-at-a-time engine's, no request is in two micro-batches at once, and the pipeline
really fills."""
from __future__ import annotations

import itertools
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sarathi_lab import LLM, SamplingParams
from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.block_manager import BlockManager
from sarathi_lab.engine.clock import VirtualClock
from sarathi_lab.engine.executor import PipelineExecutor, StepOutput
from sarathi_lab.engine.llm_engine import LLMEngine
from sarathi_lab.engine.metrics import Metrics
from sarathi_lab.engine.scheduler import make_scheduler, scheduler_names
from sarathi_lab.engine.sequence import Sequence

SETTINGS = {"chunk_size": 8, "max_batch_size": 2, "device": "cpu", "dtype": "float32", "warmup_iters": 0,
            "seed": 3, "num_threads": 1, "max_model_len": 64, "num_kv_blocks": 64}


class Deferred(PipelineExecutor):
    """Runs a batch with ``inner`` when it is collected, oldest first; checks what the engine sends it:
    never a request that is in a micro-batch in flight, and a prompt's chunk from where its last one
    ended (the cached tokens are exactly those of the micro-batches collected)."""

    def __init__(self, inner, depth: int):
        self.inner, self.depth = inner, depth
        self.queue: deque[ScheduledBatch] = deque()
        self.most_in_flight = 0
        self.drained = 0

    def start(self, sampling: SamplingParams) -> None:
        self.inner.start(sampling)

    def submit(self, batch: ScheduledBatch) -> None:
        assert len(self.queue) < self.depth
        flying = {c.seq.seq_id for b in self.queue for c in b.chunks}
        assert not flying & {c.seq.seq_id for c in batch.chunks}, "a request in two micro-batches at once"
        assert all(c.start == c.seq.num_computed for c in batch.chunks)
        self.queue.append(batch)
        self.most_in_flight = max(self.most_in_flight, len(self.queue))

    def collect(self) -> StepOutput:
        return self.inner.execute(self.queue.popleft())

    def drain(self) -> None:
        self.drained += len(self.queue)
        self.queue.clear()


def pipelined(llm: LLM, depth: int) -> Deferred:
    """``llm``'s engine rebuilt over a Deferred of its own executor."""
    engine = llm.engine
    executor = Deferred(engine.executor, depth)
    llm.engine = LLMEngine(engine.scheduler, executor, engine.clock)
    return executor


PROMPTS = [[7] * 19, [3, 1, 4, 1, 5, 9, 2, 6], [11] * 13, [2] * 3, [5, 6] * 5]
NEW = [4, 7, 3, 6, 5]


@pytest.mark.parametrize("scheduler", scheduler_names())
@pytest.mark.parametrize("depth", [2, 4])
def test_micro_batches_in_flight_give_the_engines_tokens(scheduler, depth):
    want = LLM("tiny", scheduler=scheduler, **SETTINGS).generate(PROMPTS, NEW)
    llm = LLM("tiny", scheduler=scheduler, **SETTINGS)
    executor = pipelined(llm, depth)
    assert llm.generate(PROMPTS, NEW) == want
    assert executor.most_in_flight >= 2
    # Iterations overlap: the next micro-batch starts before the one ahead of it has returned.
    its = llm.metrics.iterations
    assert any(b.start < a.start + a.duration for a, b in itertools.pairwise(its))
    assert not llm.engine.scheduler.in_flight and not executor.queue


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheduler=st.sampled_from(scheduler_names()), depth=st.integers(2, 3),
       lengths=st.lists(st.tuples(st.integers(1, 24), st.integers(1, 6)), min_size=1, max_size=5),
       blocks=st.sampled_from([None, 12]))
def test_any_workload_and_cache_gives_the_engines_sampled_tokens(scheduler, depth, lengths, blocks):
    # A small cache preempts (the requests not in flight); sampled tokens are keyed by request and
    # position, so that they do not depend on which micro-batch a token rides in.
    tight = SETTINGS | ({"num_kv_blocks": blocks, "block_size": 4, "max_model_len": 32} if blocks else {})
    prompts = [[(5 * i + j) % 200 for j in range(n)] for i, (n, _) in enumerate(lengths)]
    new = [d for _, d in lengths]
    sampling = SamplingParams(temperature=1.0, seed=7)
    want = LLM("tiny", scheduler=scheduler, **tight).generate(prompts, new, sampling=sampling)
    llm = LLM("tiny", scheduler=scheduler, **tight)
    pipelined(llm, depth)
    assert llm.generate(prompts, new, sampling=sampling) == want


def test_a_run_stopped_midway_drains_the_pipeline_and_the_next_run_is_whole():
    want = LLM("tiny", **SETTINGS).generate(PROMPTS, NEW)
    llm = LLM("tiny", **SETTINGS)
    executor = pipelined(llm, 3)

    def stop(record):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, NEW, on_iteration=stop)
    assert executor.drained > 0 and not executor.queue and not llm.engine.scheduler.in_flight
    assert llm.generate(PROMPTS, NEW) == want


class Tokens:
    """An executor of no model: token 1 for every sampled request (the schedulers never read values)."""

    def start(self, sampling):
        pass

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        return StepOutput([1] * len(batch.sampled), 0.0, 0.0, 0.0)


@settings(max_examples=60, deadline=None)
@given(scheduler=st.sampled_from(scheduler_names()), depth=st.integers(2, 4), batch=st.integers(1, 3),
       blocks=st.integers(10, 40),
       lengths=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 8)), min_size=1, max_size=8))
def test_every_scheduler_leaves_requests_in_flight_alone(scheduler, depth, batch, blocks, lengths):
    # Decodes and a chunked prompt's next chunk alike wait for their micro-batch's tokens; preemptions
    # (a small cache) take only requests not in flight; every request gets all its tokens.
    sched = make_scheduler(scheduler, BlockManager(blocks, 4), max_batch_size=batch, max_model_len=40,
                           chunk_size=8, token_budget=8)
    executor = Deferred(Tokens(), depth)
    engine = LLMEngine(sched, executor, VirtualClock())
    seqs = [Sequence(i, [1] * p, d) for i, (p, d) in enumerate(lengths)]
    engine.run(seqs, Metrics(), SamplingParams())
    assert all(len(s.tokens) == s.prompt_len + s.max_new_tokens for s in seqs)
    assert not sched.in_flight and sched.blocks.num_free == blocks
