"""The SLO guard counts incrementally what its definition counts over every request at every
iteration: checked against that definition, recomputed from the records, on a run that overloads
(long waits, long gaps, preemptions)."""
from __future__ import annotations

import random

import pytest

from sarathi_lab.engine.block_manager import BlockManager
from sarathi_lab.engine.clock import VirtualClock
from sarathi_lab.engine.llm_engine import LLMEngine
from sarathi_lab.engine.metrics import SLO, Metrics
from sarathi_lab.engine.scheduler import make_scheduler
from sarathi_lab.engine.sequence import SamplingParams, Sequence
from sarathi_lab.engine.slo_guard import SLOGuard
from tests.clocked import ClockedExecutor


def _token_timed(batch) -> float:
    return 0.01 + 1e-4 * batch.num_tokens


@pytest.mark.parametrize("scheduler", ["sarathi_serve", "vllm", "static"])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_guard_counts_what_its_definition_counts(scheduler, seed):
    rng = random.Random(seed)
    # A gap is over its limit when 3 or more tokens share its iteration.
    n, delay_limit, gap_limit = 60, 0.5, 0.0102
    clock = VirtualClock()
    engine = LLMEngine(make_scheduler(scheduler, BlockManager(96, 16), max_batch_size=8, token_budget=256,
                                      max_model_len=448), ClockedExecutor(clock, _token_timed), clock)
    seqs = [Sequence(i, [1] * rng.randint(8, 400), rng.randint(1, 40), arrival=rng.uniform(0, 3)) for i in range(n)]
    # Limits that decide nothing: the counts are compared at every iteration, to the end.
    guard = SLOGuard(SLO(sched_delay_p50_s=delay_limit, tbt_p99_s=gap_limit), engine, 10**9, 10**9)
    checks = []

    def check(record):
        guard(record)
        now, requests = engine.elapsed(), engine.metrics.requests
        late = sum((r.first_scheduled if r.first_scheduled is not None else now) - r.arrival > delay_limit
                   for r in requests)
        gaps_over = sum(b - a > gap_limit for r in requests for a, b in zip(r.token_times, r.token_times[1:]))
        ongoing = sum(1 for r in requests if r.token_times and r.finish is None and now - r.token_times[-1] > gap_limit)
        assert guard._late == late
        assert guard._gaps_over == gaps_over
        assert guard._count_gaps([], now, gap_limit) == ongoing
        checks.append((late, gaps_over, ongoing))

    engine.run(seqs, Metrics(), SamplingParams(ignore_eos=True), on_iteration=check)
    assert len(checks) > 50
    # The run did overload: waits and gaps over the limits were there to count.
    assert checks[-1][0] > 0 and checks[-1][1] > 0
