"""Golden batch compositions: every scheduler on one fixed workload, iteration by iteration.

Reviewed by hand against the papers' definitions (2026-11-22). Three requests arrive at once:
R0 (prompt 20, 3 new tokens), R1 (prompt 9, 4 new), R2 (prompt 5, 2 new); at most 2 requests
per batch; chunk (sarathi) and token budget (sarathi_serve) 8. `P1:9` is 9 prompt tokens of R1,
`D0` one decode of R0; a request's first token comes from the iteration that ends its prompt.

- static (FasterTransformer): R0 and R1 prefilled whole together, decoded until both finish
  (R0 after 3 tokens, R1 after 4); only then is R2 admitted.
- vllm: whole prompts in prefill-only iterations, prioritised: once R0 finishes, R2's prefill runs
  alone and R1's decode stalls for that iteration (the generation stall Sarathi-Serve names).
- orca: whole prompts ride with every running decode: R2's prefill shares an iteration with D1.
- sarathi: one chunk of at most 8 prompt tokens per iteration, plus every running decode
  (decode-maximal): R1's chunks ride with R0's decodes.
- sarathi_serve: decodes first, then chunks of ongoing and new prompts until 8 tokens: R0's last
  4 tokens and R1's first 4 share an iteration, and no decode ever waits for a prefill.
"""
from __future__ import annotations

import pytest

from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.block_manager import BlockManager
from sarathi_lab.engine.clock import VirtualClock
from sarathi_lab.engine.executor import Executor, StepOutput
from sarathi_lab.engine.llm_engine import LLMEngine
from sarathi_lab.engine.metrics import Metrics
from sarathi_lab.engine.scheduler import make_scheduler, scheduler_names
from sarathi_lab.engine.sequence import SamplingParams, Sequence

GOLDEN = {
    "static": "P0:20 P1:9 | D0 D1 | D0 D1 | D1 | P2:5 | D2",
    "vllm": "P0:20 P1:9 | D0 D1 | D0 D1 | P2:5 | D1 D2",
    "orca": "P0:20 P1:9 | D0 D1 | D0 D1 | P2:5 D1 | D2",
    "sarathi": "P0:8 | P0:8 | P0:4 | P1:8 D0 | P1:1 D0 | P2:5 D1 | D1 D2 | D1",
    "sarathi_serve": "P0:8 | P0:8 | P0:4 P1:4 | P1:5 D0 | D0 D1 | P2:5 D1 | D1 D2",
}


class Recorder(Executor):
    def __init__(self, clock: VirtualClock):
        self.clock, self.batches = clock, []

    def start(self, sampling):
        pass

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        self.batches.append(" ".join([f"P{c.seq.seq_id}:{c.num_tokens}" for c in batch.prefills]
                                     + [f"D{s.seq_id}" for s in batch.decodes]))
        self.clock.advance(1.0)
        return StepOutput([1] * len(batch.sampled), 0.0, 1.0, 0.0)


def test_every_scheduler_has_a_golden_trace():
    assert set(GOLDEN) == set(scheduler_names())


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_batch_composition_matches_the_golden_trace(name):
    clock = VirtualClock()
    recorder = Recorder(clock)
    scheduler = make_scheduler(name, BlockManager(64, 4), max_batch_size=2, chunk_size=8,
                               max_model_len=24)
    requests = [Sequence(0, [1] * 20, 3), Sequence(1, [1] * 9, 4), Sequence(2, [1] * 5, 2)]
    LLMEngine(scheduler, recorder, clock).run(requests, Metrics(), SamplingParams(ignore_eos=True))
    assert " | ".join(recorder.batches) == GOLDEN[name]


def test_a_batch_is_a_snapshot_of_what_was_scheduled():
    scheduler = make_scheduler("sarathi", BlockManager(64, 4), max_batch_size=2, chunk_size=8, max_model_len=24)
    seq = Sequence(0, [1] * 10, 3)
    scheduler.add(seq)
    scheduler.update(scheduler.schedule(), [])  # the first 8 prompt tokens
    last_chunk = scheduler.schedule()
    scheduler.update(last_chunk, [5])  # caches them, appends the sampled token
    assert [(c.start, c.num_tokens, c.samples) for c in last_chunk.chunks] == [(8, 2, True)]
    assert last_chunk.sampled == (seq,) and last_chunk.kv_tokens_read == 10


def test_a_batch_of_decodes_is_a_snapshot_too():
    """Decodes are kept as plain contexts, not chunks: read after update (chunks first built then),
    the batch still says what ran."""
    scheduler = make_scheduler("orca", BlockManager(64, 4), max_batch_size=2, max_model_len=24)
    first, second = Sequence(0, [1] * 4, 3), Sequence(1, [1] * 7, 3)
    for seq in (first, second):
        scheduler.add(seq)
    scheduler.update(scheduler.schedule(), [5, 5])  # both prompts; each samples its first token
    decodes = scheduler.schedule()
    scheduler.update(decodes, [6, 6])
    assert decodes.decode_contexts == (5, 8) and decodes.kv_tokens_read == 13
    assert [(c.seq, c.start, c.num_tokens, c.samples) for c in decodes.chunks] == [(first, 4, 1, True),
                                                                                   (second, 7, 1, True)]
    assert decodes.sampled == (first, second)
    assert (first.num_computed, second.num_computed) == (5, 8)


def test_requests_in_flight_are_held_out_of_the_next_batch():
    scheduler = make_scheduler("orca", BlockManager(64, 4), max_batch_size=4, max_model_len=24)
    for i in range(2):
        scheduler.add(Sequence(i, [1] * 4, 3))
    scheduler.update(scheduler.schedule(), [7, 7])  # both prefilled
    scheduler.in_flight.add(0)
    assert [c.seq.seq_id for c in scheduler.schedule().chunks] == [1]
    assert [s.seq_id for s in scheduler.running] == [0, 1]
