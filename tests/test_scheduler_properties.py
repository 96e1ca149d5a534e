"""Scheduler and block-manager invariants over random workloads, through the real engine loop with
the model's forward replaced by random logits (the schedulers never look at values)."""
from __future__ import annotations

import random
import types

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.block_manager import BlockManager, blocks_beside_watermark, watermark_blocks
from sarathi_lab.engine.clock import VirtualClock
from sarathi_lab.engine.executor import Executor, StepOutput
from sarathi_lab.engine.llm_engine import LLMEngine
from sarathi_lab.engine.metrics import Metrics
from sarathi_lab.engine.scheduler import make_scheduler, scheduler_names
from sarathi_lab.engine.sequence import SamplingParams, Sequence

BLOCK = 4


class CheckingExecutor(Executor):
    """Checks every batch against the scheduler's promises (its policy and the block manager's
    bookkeeping), then returns random tokens: the schedulers never look at values."""

    def __init__(self, scheduler, config: types.SimpleNamespace, clock: VirtualClock):
        self.scheduler, self.config, self.clock = scheduler, config, clock
        self.rng = random.Random(0)
        self.batches = []
        self.chunks = []  # per batch: (prompt tokens, decodes, what the prompts had left before it)
        self.running_before: set[int] = set()
        self.ran: set[int] = set()  # requests in a batch since they were last preempted

    def start(self, sampling):
        pass

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        s, blocks = self.scheduler, self.scheduler.blocks
        assert len(s.running) <= self.config.max_batch_size
        members = [c.seq for c in batch.chunks]
        assert len(members) == len(set(map(id, members))), "a request twice in one batch"
        assert all(seq in s.running for seq in members)
        prefill = batch.num_prefill_tokens
        decoding = [seq for seq in s.running if seq.num_uncomputed == 1 and seq.num_generated]
        whole = all(c.num_tokens == c.seq.num_uncomputed for c in batch.prefills)
        if s.name in ("orca", "sarathi", "sarathi_serve"):
            assert all(seq in batch.decodes for seq in decoding), "a running decode left out"
        if s.name == "sarathi":
            assert len(batch.prefills) <= 1 and prefill <= self.config.chunk_size
        if s.name == "sarathi_serve":
            assert prefill <= max(0, self.config.chunk_size - batch.num_decode_tokens)
        if s.name in ("vllm", "static"):
            assert not (batch.prefills and batch.decodes), f"{s.name} mixes prefill and decode"
        if s.name in ("vllm", "orca", "static"):
            assert whole, f"{s.name} chunked a prompt"
        cap = self.config.max_num_batched_tokens
        if s.name == "vllm" and cap is not None:
            assert prefill <= cap or len(batch.prefills) == 1, f"{prefill} prompt tokens over the cap of {cap}"
        if s.name == "static":
            admitted = {seq.seq_id for seq in s.running} - self.running_before
            assert not admitted or not self.running_before, "static admitted into an unfinished batch"
        # orca and static hold the blocks of max_model_len tokens from admission on, as
        # sarathi-serve's Orca block manager reserves them; the paged schedulers exactly the blocks
        # the cached tokens plus this chunk need: none spare.
        reserved = -(-self.config.max_model_len // BLOCK) if s.name in ("orca", "static") else 0
        for c in batch.chunks:
            assert len(c.seq.block_table) == (reserved or -(-(c.seq.num_computed + c.num_tokens) // BLOCK))
        if reserved:
            assert not batch.preempted, f"{s.name} preempted a request holding its reservation"
        # A request is admitted (first chunk, or first after a preemption) only when the blocks of
        # all its tokens are free, as in Sarathi-Serve's can_allocate, not just its first chunk's,
        # and the watermark's blocks with them. Admissions come last in a batch, so the blocks free
        # at each one are those free now plus what it and the admissions after it took.
        free_then = blocks.num_free
        for c in reversed(batch.prefills):
            if c.seq.num_computed > 0:
                break
            free_then += len(c.seq.block_table)
            need = reserved or -(-len(c.seq.tokens) // BLOCK)
            assert free_then >= need + blocks.watermark_blocks, f"{s.name} admitted {c.seq.seq_id} on a chunk"
        for seq in batch.preempted:
            assert seq.seq_id in self.ran, f"{s.name} preempted request {seq.seq_id}, which had not run"
            self.ran.discard(seq.seq_id)
        self.ran |= {c.seq.seq_id for c in batch.chunks}
        held = [b for seq in s.running for b in seq.block_table]
        assert len(held) == len(set(held)), "a block shared by two requests"
        assert len(held) + blocks.num_free == blocks.num_blocks, "a block leaked"
        self.batches.append([(c.seq.seq_id, c.num_tokens) for c in batch.chunks])
        self.chunks.append((prefill, batch.num_decode_tokens, sum(c.seq.num_uncomputed for c in batch.prefills)))
        self.clock.advance(1e-3 * batch.num_tokens)
        return StepOutput([self.rng.randrange(8) for _ in batch.sampled], 0.0, 1e-3 * batch.num_tokens, 0.0)


def run_workload(scheduler_name, requests, num_blocks, batch_size, chunk, arrivals=None, cap=None,
                 max_model_len=None, watermark=0.0, knobs=None):
    config = types.SimpleNamespace(max_batch_size=batch_size, chunk_size=chunk,
                                   max_model_len=max_model_len or max(p + n for p, n in requests),
                                   max_num_batched_tokens=cap)
    scheduler = make_scheduler(scheduler_name, BlockManager(num_blocks, BLOCK, watermark), knobs, **vars(config))
    clock = VirtualClock()
    executor = CheckingExecutor(scheduler, config, clock)
    arrivals = arrivals or [0.0] * len(requests)
    seqs = [Sequence(i, [1] * p, n, a) for i, ((p, n), a) in enumerate(zip(requests, arrivals))]
    metrics = Metrics()
    finished = []
    original_update = scheduler.update

    def update(batch, tokens):
        done = original_update(batch, tokens)
        finished.extend(done)
        executor.running_before = {seq.seq_id for seq in scheduler.running}
        return done

    scheduler.update = update
    LLMEngine(scheduler, executor, clock).run(seqs, metrics, SamplingParams())
    return seqs, finished, metrics, executor, scheduler


workloads = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 12)), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheduler_name=st.sampled_from(scheduler_names()), requests=workloads,
       spare_blocks=st.integers(0, 40), batch_size=st.integers(1, 6), chunk=st.integers(1, 48),
       cap=st.none() | st.integers(1, 60), longer=st.integers(0, 200),
       watermark=st.sampled_from([0.0, 0.01, 0.1, 0.3]))
# static once admitted three prompts into 5 blocks and recorded two "preemptions" of requests never run.
@example(scheduler_name="static", requests=[(16, 2), (16, 2), (4, 2)], spare_blocks=0, batch_size=3, chunk=8, cap=None,
         longer=0, watermark=0.0)
# sarathi admitted a 5-token prompt on its first 1-token chunk with one block free for its two.
@example(scheduler_name="sarathi", requests=[(1, 2), (5, 1)], spare_blocks=0, batch_size=2, chunk=1, cap=None,
         longer=0, watermark=0.0)
def test_every_request_finishes_once_within_limits(scheduler_name, requests, spare_blocks, batch_size, chunk, cap,
                                                   longer, watermark):
    # The cache always fits the largest request alone beside the watermark, and sometimes little more:
    # preemption territory. max_model_len is at least the largest request and at most what one
    # request can be admitted with.
    largest = max(p + n for p, n in requests)
    num_blocks = blocks_beside_watermark(-(-largest // BLOCK), watermark) + spare_blocks
    max_model_len = min(largest + longer, (num_blocks - watermark_blocks(watermark, num_blocks)) * BLOCK)
    if scheduler_name == "sarathi_serve":
        chunk = max(chunk, batch_size + 1)  # a budget the decodes alone cannot fill
    seqs, finished, metrics, _, scheduler = run_workload(scheduler_name, requests, num_blocks, batch_size, chunk,
                                                         cap=cap, max_model_len=max_model_len, watermark=watermark)
    assert sorted(s.seq_id for s in finished) == list(range(len(requests))), "finished other than once each"
    assert [s.num_generated for s in seqs] == [n for _, n in requests]
    assert scheduler.blocks.num_free == num_blocks
    assert all(r.finish is not None and len(r.token_times) == r.output_len for r in metrics.requests)
    assert sum(i.num_preempted for i in metrics.iterations) == sum(r.num_preemptions for r in metrics.requests)



def test_a_chunked_prefill_is_not_preempted_and_readmitted_every_iteration():
    # R0 (4 + 17 tokens) grows to 5 of the 6 blocks. R1's 12-token prompt (3 blocks) was admitted on
    # a 3-token chunk, preempted when R0 took the block it needed next, readmitted in the same
    # iteration, and so on while R0 decoded: 7 preemptions, 62 prefill tokens for 16 prompt tokens.
    # Admitted only with its 3 blocks free, it is preempted once, after its prefill, and recomputed
    # (12 tokens, its last as a decode) once R0 has finished.
    _, _, metrics, _, _ = run_workload("sarathi_serve", [(4, 17), (12, 2)], num_blocks=6, batch_size=2, chunk=4)
    assert sum(r.num_preemptions for r in metrics.requests) == 1
    assert sum(i.num_prefill_tokens for i in metrics.iterations) == 4 + 12 + 12


def test_admission_keeps_the_watermark_free():
    # Two requests of 44 + 4 tokens (prompts of 11 blocks of 4; orca and static reserve 12) in 24
    # blocks: without a watermark the second is admitted beside the first, with 1-2 blocks left;
    # kv_watermark 0.125 keeps 3 free (int(0.125 * 24), as vLLM counts), so it waits for the first.
    for name in scheduler_names():
        for watermark, at_once in ((0.0, 2), (0.125, 1)):
            _, _, _, executor, _ = run_workload(name, [(44, 4)] * 2, 24, 2, 48, watermark=watermark)
            assert max(map(len, executor.batches)) == at_once, (name, watermark)


def test_orca_and_static_reserve_max_model_len_for_each_request_so_fewer_run_at_once():
    # Four requests of 8 + 4 tokens (3 blocks of 4 each at most) under max_model_len 32 (8 blocks), in
    # 16 blocks: the paged vllm holds all four at once; orca and static two reservations at a time,
    # as sarathi-serve's Orca block manager and vidur's Orca and FasterTransformer schedulers do.
    for name, at_once in (("vllm", 4), ("orca", 2), ("static", 2)):
        _, _, metrics, executor, _ = run_workload(name, [(8, 4)] * 4, 16, 4, 8, max_model_len=32)
        assert max(map(len, executor.batches)) == at_once, name
        assert sum(r.num_preemptions for r in metrics.requests) == 0, name


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheduler_name=st.sampled_from(scheduler_names()),
       requests=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 12), st.integers(0, 60)), min_size=2,
                         max_size=10),
       spare_blocks=st.integers(0, 20), batch_size=st.integers(1, 4), chunk=st.integers(5, 48))
# Request 1, due at 20 ms, was admitted ahead of request 2, waiting since 1 ms: the queue kept id order.
@example(scheduler_name="vllm", requests=[(30, 10, 0), (8, 2, 20), (8, 2, 1)], spare_blocks=20, batch_size=1,
         chunk=8)
def test_requests_are_admitted_in_arrival_order_whatever_their_ids(scheduler_name, requests, spare_blocks,
                                                                   batch_size, chunk):
    # Arrivals in ms on a clock that moves 1 ms per token: requests arrive while others run. Ids
    # follow the input order, not arrival, as with an unsorted trace or caller's arrival_times.
    num_blocks = -(-max(p + n for p, n, _ in requests) // BLOCK) + spare_blocks
    _, _, metrics, _, _ = run_workload(scheduler_name, [(p, n) for p, n, _ in requests], num_blocks, batch_size,
                                       chunk, [a * 1e-3 for _, _, a in requests])
    # Every policy admits from the head of its queue only, so an earlier arrival is never passed.
    for a in metrics.requests:
        for b in metrics.requests:
            if a.arrival < b.arrival:
                assert a.first_scheduled <= b.first_scheduled, (a, b)


def test_vllm_prefills_whole_prompts_up_to_its_token_cap_and_a_longer_one_alone():
    # Prompts of 10, 10, 25 and 5 under a cap of 24: [10, 10], then 25 alone (over the cap, yet it must
    # run), then 5; uncapped, all four in one iteration.
    requests = [(10, 1), (10, 1), (25, 1), (5, 1)]
    prefills = lambda ex: [[n for _, n in b] for b in ex.batches]
    _, _, _, capped, _ = run_workload("vllm", requests, 64, 8, 16, cap=24)
    assert prefills(capped) == [[10, 10], [25], [5]]
    _, _, _, free, _ = run_workload("vllm", requests, 64, 8, 16)
    assert prefills(free) == [[10, 10, 25, 5]]


@given(blocks=st.integers(0, 10**6), watermark=st.floats(0, 0.999))
def test_the_blocks_beside_a_watermark_are_the_fewest_that_admit_them(blocks, watermark):
    total = blocks_beside_watermark(blocks, watermark)
    assert total - watermark_blocks(watermark, total) >= blocks
    assert blocks == 0 or (total - 1) - watermark_blocks(watermark, total - 1) < blocks
