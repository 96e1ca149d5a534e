"""Scheduler and block-manager invariants over random workloads, through the real engine loop with
the model's forward replaced by random logits (the schedulers never look at values)."""
from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sarathi_lab.engine.block_manager import BlockManager
from sarathi_lab.engine.clock import DeviceClock
from sarathi_lab.engine.llm_engine import LLMEngine
from sarathi_lab.engine.metrics import Metrics
from sarathi_lab.engine.model_runner import ModelRunner
from sarathi_lab.engine.sampler import Sampler
from sarathi_lab.engine.scheduler import SchedulerConfig, make_scheduler, scheduler_names
from sarathi_lab.engine.sequence import SamplingParams, Sequence

BLOCK = 4


class CheckingRunner(ModelRunner):
    """Checks every batch against the scheduler's promises, then returns random logits."""

    def __init__(self, scheduler, config: SchedulerConfig):
        super().__init__(model=None, kv_caches=[], block_size=BLOCK, device=torch.device("cpu"))
        self.scheduler, self.config = scheduler, config
        self.gen = torch.Generator().manual_seed(0)
        self.batches = []

    def prepare(self, batch):
        s, blocks = self.scheduler, self.scheduler.blocks
        assert len(s.running) <= self.config.max_batch_size
        members = [c.seq for c in batch.chunks]
        assert len(members) == len(set(map(id, members))), "a request twice in one batch"
        assert all(seq in s.running for seq in members)
        prefill = batch.num_prefill_tokens
        if s.name == "sarathi":
            assert len(batch.prefills) <= 1 and prefill <= self.config.chunk_size
        if s.name == "sarathi_serve":
            assert prefill <= max(0, self.config.token_budget - batch.num_decode_tokens)
        if s.name == "vllm":
            assert not (batch.prefills and batch.decodes), "vllm mixes prefill and decode"
        for c in batch.chunks:
            # Exactly the blocks the cached tokens plus this chunk need: none spare.
            assert len(c.seq.block_table) == -(-(c.seq.num_computed + c.num_tokens) // BLOCK)
        held = [b for seq in s.running for b in seq.block_table]
        assert len(held) == len(set(held)), "a block shared by two requests"
        assert len(held) + blocks.num_free == blocks.num_blocks, "a block leaked"
        self.batches.append([(c.seq.seq_id, c.num_tokens) for c in batch.chunks])
        return super().prepare(batch)

    def forward(self, prepared):
        return torch.randn(len(prepared.sampled), 8, generator=self.gen)


workloads = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 12)), min_size=1, max_size=12)


def run_workload(scheduler_name, requests, num_blocks, batch_size, chunk):
    config = SchedulerConfig(max_batch_size=batch_size, chunk_size=chunk, token_budget=chunk)
    scheduler = make_scheduler(scheduler_name, config, BlockManager(num_blocks, BLOCK))
    runner = CheckingRunner(scheduler, config)
    seqs = [Sequence(i, [1] * p, n) for i, (p, n) in enumerate(requests)]
    metrics = Metrics()
    finished = []
    original_complete = scheduler.complete

    def complete(batch):
        done = original_complete(batch)
        finished.extend(done)
        return done

    scheduler.complete = complete
    LLMEngine(scheduler, runner, DeviceClock(torch.device("cpu"))).run(
        seqs, Sampler(SamplingParams(), torch.device("cpu")), metrics)
    return seqs, finished, metrics, runner, scheduler


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheduler_name=st.sampled_from(scheduler_names()), requests=workloads,
       spare_blocks=st.integers(0, 40), batch_size=st.integers(1, 6), chunk=st.integers(1, 48))
def test_every_request_finishes_once_within_limits(scheduler_name, requests, spare_blocks, batch_size, chunk):
    # The cache always fits the largest request alone, and sometimes little more: preemption territory.
    largest = max(p + n for p, n in requests)
    num_blocks = -(-largest // BLOCK) + spare_blocks
    if scheduler_name == "sarathi_serve":
        chunk = max(chunk, batch_size + 1)  # a budget the decodes alone cannot fill
    seqs, finished, metrics, runner, scheduler = run_workload(scheduler_name, requests, num_blocks,
                                                              batch_size, chunk)
    assert sorted(s.seq_id for s in finished) == list(range(len(requests))), "finished other than once each"
    assert [s.num_generated for s in seqs] == [n for _, n in requests]
    assert scheduler.blocks.num_free == num_blocks
    assert all(r.finish is not None and len(r.token_times) == r.output_len for r in metrics.requests)
    assert sum(i.num_preempted for i in metrics.iterations) == sum(r.num_preemptions for r in metrics.requests)
