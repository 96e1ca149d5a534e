"""The SLO guard stops a run at the iteration where its definition, recomputed from every record
at every iteration, first makes the verdict certain: on a run that overloads (long waits, long gaps,
preemptions), for verdicts that need few and many values over the limit."""
from __future__ import annotations

import random

import numpy as np
import pytest

from sarathi_lab.engine.block_manager import BlockManager
from sarathi_lab.engine.clock import VirtualClock
from sarathi_lab.engine.llm_engine import LLMEngine
from sarathi_lab.engine.metrics import SLO, Metrics
from sarathi_lab.engine.scheduler import make_scheduler
from sarathi_lab.engine.sequence import SamplingParams, Sequence
from sarathi_lab.engine.slo_guard import SLOGuard, SLOViolated, over_needed
from tests.clocked import ClockedExecutor

NEEDED = (1, 3, 10, 30, 100, 300, 1000)


def _token_timed(batch) -> float:
    return 0.01 + 1e-4 * batch.num_tokens


def _total_for(needed: int, percentile: float) -> int:
    """A count of values whose percentile needs ``needed`` of them over a limit."""
    return next(t for t in range(1, 10**6) if over_needed(t, percentile) == needed)


def test_over_needed_is_what_numpys_percentile_needs():
    # With that many values over a limit numpy's percentile is over it whatever the others are;
    # with one fewer, values just over the limit beside values far under it keep it under.
    over, limit = 0.5 + 1e-9, 0.5
    for total in range(1, 300):
        for p in (50, 99):
            k = over_needed(total, p)
            assert np.percentile([0.0] * (total - k) + [over] * k, p) > limit
            assert np.percentile([0.0] * (total - k + 1) + [over] * (k - 1), p) <= limit


@pytest.mark.parametrize("scheduler", ["sarathi_serve", "vllm", "static"])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("constraint", ["sched_delay_p50_s", "tbt_p99_s"])
def test_the_guard_stops_where_its_definition_decides(scheduler, seed, constraint):
    rng = random.Random(seed)
    # A gap is over its limit when 3 or more tokens share its iteration.
    n, delay_limit, gap_limit = 120, 0.2, 0.0102
    clock = VirtualClock()
    engine = LLMEngine(make_scheduler(scheduler, BlockManager(96, 16), max_batch_size=8, chunk_size=256,
                                      max_model_len=448), ClockedExecutor(clock, _token_timed), clock)
    seqs = [Sequence(i, [1] * rng.randint(8, 400), rng.randint(1, 40), arrival=rng.uniform(0, 3)) for i in range(n)]
    if constraint == "sched_delay_p50_s":
        slo = SLO(sched_delay_p50_s=delay_limit, tbt_p99_s=None)
        guards = {k: SLOGuard(slo, engine, _total_for(k, 50), 0) for k in NEEDED}
    else:
        slo = SLO(sched_delay_p50_s=None, tbt_p99_s=gap_limit)
        guards = {k: SLOGuard(slo, engine, n, _total_for(k, 99)) for k in NEEDED}
    counts, stops = [], {}

    def check(record):
        now, requests = engine.elapsed(), engine.metrics.requests
        if constraint == "sched_delay_p50_s":
            count = sum((r.first_scheduled if r.first_scheduled is not None else now) - r.arrival > delay_limit
                        for r in requests)
        else:
            count = sum(b - a > gap_limit for r in requests for a, b in zip(r.token_times, r.token_times[1:]))
            count += sum(1 for r in requests if r.token_times and r.finish is None
                         and now - r.token_times[-1] > gap_limit)
        counts.append(count)
        for k, guard in guards.items():
            if k not in stops:
                try:
                    guard(record)
                except SLOViolated as stop:
                    assert stop.constraint == constraint and f"{count} of " in str(stop)
                    stops[k] = len(counts) - 1

    engine.run(seqs, Metrics(), SamplingParams(ignore_eos=True), on_iteration=check)
    expected = {k: next(i for i, c in enumerate(counts) if c >= k) for k in NEEDED if max(counts) >= k}
    assert stops == expected
    # The run did overload, and the verdicts came at different iterations.
    assert len(set(expected.values())) >= 3
