"""Capacity search under SLOs, on engines over a virtual clock whose answer is known by construction."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from sarathi_lab.engine.block_manager import BlockManager
from sarathi_lab.engine.clock import VirtualClock
from sarathi_lab.engine.llm_engine import LLMEngine
from sarathi_lab.engine.metrics import SLO, Metrics
from sarathi_lab.engine.scheduler import make_scheduler
from sarathi_lab.engine.sequence import Sequence
from sarathi_lab.engine.slo_guard import over_needed
from sarathi_lab.harness.capacity import Trial, search_capacity, serve_trial
from sarathi_lab.harness.schema import CapacityCfg
from sarathi_lab.measure.tasks.capacity import _why
from tests.clocked import ClockedExecutor

SERVICE_S = 0.5  # every request takes exactly this long, alone
N = 21


def _whole_requests(batch) -> float:
    """A request is one prefill-only iteration of SERVICE_S seconds (one new token, so one step)."""
    return SERVICE_S * len(batch.prefills) + 1e-3 * len(batch.decodes)


class VirtualLLM:
    """What serve_trial needs of an LLM, over a one-request-at-a-time engine on a virtual clock."""

    def __init__(self, decode_tokens: int = 1):
        clock = VirtualClock()
        scheduler = make_scheduler("sarathi_serve", BlockManager(1024, 16), max_batch_size=1, chunk_size=4096,
                                   max_model_len=8192)
        self.engine = LLMEngine(scheduler, ClockedExecutor(clock, _whole_requests), clock)
        self.metrics = Metrics()
        self.served = 0

    def generate(self, prompts, max_new_tokens, arrival_times, sampling, on_iteration, max_concurrency=None):
        seqs = [Sequence(self.served + i, p, n, t) for i, (p, n, t) in
                enumerate(zip(prompts, max_new_tokens, arrival_times))]
        self.served += len(seqs)
        self.metrics = Metrics()
        self.engine.run(seqs, self.metrics, sampling, on_iteration, max_concurrency)


def trial_at(llm, slo, require_stable):
    def run(qps: float) -> Trial:
        arrivals = [i / qps for i in range(N)]
        return serve_trial(llm, [[1] * 8] * N, [1] * N, arrivals, slo, qps, require_stable)
    return run


def test_capacity_is_found_within_its_resolution():
    # Deterministic arrivals every 1/q s, one request served at a time in SERVICE_S: request i waits
    # max(0, i (SERVICE_S - 1/q)), so the median of 21 waits (request 10's) is <= 2 s exactly while
    # q <= 1 / (SERVICE_S - 0.2).
    known = 1 / (SERVICE_S - 2.0 / 10)
    slo = SLO(sched_delay_p50_s=2.0)
    result = search_capacity(trial_at(VirtualLLM(), slo, require_stable=False),
                             CapacityCfg(start_qps=1.0, resolution=0.02))
    assert result.bounded and result.binding == "sched_delay_p50_s"
    assert known / 1.02 <= result.capacity_rps <= known
    failing = min(t.rate_rps for t in result.trials if not t.passed)
    assert known < failing <= result.capacity_rps * 1.02
    assert len(result.trials) <= 10


def test_requiring_stability_stops_below_the_percentile_bound():
    # The queue grows from 1/SERVICE_S = 2 requests/s on: a finite trial's median can still pass,
    # but no longer trial would. Required stable, the capacity lies between the two.
    slo = SLO(sched_delay_p50_s=2.0)
    result = search_capacity(trial_at(VirtualLLM(), slo, require_stable=True),
                             CapacityCfg(start_qps=1.0, resolution=0.02))
    assert result.binding == "saturated"
    assert 1 / SERVICE_S <= result.capacity_rps < 1 / (SERVICE_S - 0.2)


def test_an_overloaded_trial_stops_as_soon_as_its_verdict_is_certain():
    slo = SLO(sched_delay_p50_s=2.0)
    llm = VirtualLLM()
    trial = trial_at(llm, slo, require_stable=False)(50.0)
    assert not trial.passed and trial.stopped_early and trial.binding == "sched_delay_p50_s"
    # Stopped once 11 of 21 requests (over_needed) had waited > 2 s: request 10 is still waiting.
    assert over_needed(N, 50) == 11
    assert sum(r.finish is not None for r in llm.metrics.requests) < N // 2
    assert llm.engine.scheduler.blocks.num_free == 1024  # the engine gave everything back


def test_a_trial_stopped_before_its_last_arrivals_counts_them_unfinished():
    # 16 requests at 0 s, served one per 0.5 s: at 2.5 s requests 5-15 have waited over 2 s, the
    # median delay can no longer pass, and the trial stops before the last 5 (due at 100 s) arrive.
    arrivals = [0.0] * 16 + [100.0] * 5
    llm = VirtualLLM()
    trial = serve_trial(llm, [[1] * 8] * N, [1] * N, arrivals, SLO(sched_delay_p50_s=2.0), 1.0)
    assert trial.stopped_early and len(llm.metrics.requests) == 16
    assert trial.summary["num_requests"] == 5 and trial.summary["num_unfinished"] == N - 5


def test_every_rate_passing_is_reported_as_a_lower_bound():
    result = search_capacity(lambda q: Trial(q, True, None, False), CapacityCfg(start_qps=1.0, max_qps=100.0))
    assert not result.bounded and result.capacity_rps == 100.0  # the bound itself is tried, once
    assert [t.rate_rps for t in result.trials] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 100.0]


def test_the_log_line_rounds_to_what_the_bracket_resolves_and_names_a_lower_bound():
    # Bisecting 1.0 and 2.0 to 5% stops at a capacity like 1.2968395546510096: two or three digits say it.
    bounded = search_capacity(_up_to(1.3), CapacityCfg(start_qps=1.0, resolution=0.05))
    assert bounded.describe().startswith(f"capacity {bounded.capacity_rps:.3g} req/s (fails by ")
    assert "binding: tbt_p99_s" in bounded.describe() and "1.2968" not in bounded.describe()
    unbounded = search_capacity(lambda q: Trial(q, True, None, False), CapacityCfg(start_qps=20.0, max_trials=5))
    assert unbounded.describe() == ("capacity >= 320 req/s: every rate tried passed, so this is a lower bound, "
                                    "not a capacity after 5 trials")
    none = search_capacity(lambda q: Trial(q, False, "tbt_p99_s", False), CapacityCfg(start_qps=1.0, min_qps=0.25))
    assert none.describe().startswith("capacity below 0.25 req/s: even the lowest rate tried failed")


def test_even_the_lowest_rate_failing_gives_no_capacity():
    result = search_capacity(lambda q: Trial(q, False, "tbt_p99_s", False), CapacityCfg(start_qps=1.0, min_qps=0.1))
    assert result.capacity_rps is None and result.binding == "tbt_p99_s"
    assert [t.rate_rps for t in result.trials] == [1.0, 0.5, 0.25, 0.125, 0.1]


def _up_to(capacity: float):
    return lambda q: Trial(q, q <= capacity, None if q <= capacity else "tbt_p99_s", False)


def test_a_capacity_between_the_last_step_and_a_bound_is_found():
    # Halving from 1 steps from 0.5 past min_qps = 0.3 to 0.25: 0.3 is tried, passes, and the search
    # narrows in on 0.4. Doubling from 2 past max_qps = 3 to 4: 3 is tried and passes.
    low = search_capacity(_up_to(0.4), CapacityCfg(start_qps=1.0, resolution=0.05, min_qps=0.3))
    assert low.bounded and 0.4 / 1.05 <= low.capacity_rps <= 0.4
    high = search_capacity(_up_to(3.5), CapacityCfg(start_qps=1.0, max_qps=3.0))
    assert not high.bounded and high.capacity_rps == 3.0


@pytest.mark.parametrize("total, p, needed", [(21, 50, 11), (20, 50, 11), (100, 99, 2), (1000, 99, 11), (1, 99, 1)])
def test_over_needed_is_the_fewest_values_that_decide_a_percentile(total, p, needed):
    import numpy as np
    assert over_needed(total, p) == needed
    limit, just_over = 1.0, 1.0 + 1e-9
    values = np.zeros(total)
    values[total - needed:] = just_over
    assert np.percentile(values, p) > limit  # however small the excess, the verdict is certain
    values[total - needed] = 0.0
    assert np.percentile(values, p) <= limit  # one fewer, and it is not


@pytest.mark.parametrize("rates, passing, why", [
    ([1.0, 0.5, 0.25], 0.0, "even the lowest rate, capacity.min_qps=0.25, failed"),
    ([1.0, 2.0, 4.0], 9.0, "every rate up to capacity.max_qps=4.0 passed: capacity >= 4.0"),
    ([1.0, 2.0], 9.0, "capacity.max_trials=2 ran out"),  # stopped doubling below max_qps: not the bound's doing
    ([1.0, 0.5], 0.0, "capacity.max_trials=2 ran out"),
])
def test_a_search_that_stops_early_says_why(rates, passing, why):
    found = search_capacity(_up_to(passing),
                            CapacityCfg(start_qps=1.0, min_qps=0.25, max_qps=4.0, max_trials=len(rates)))
    assert [t.rate_rps for t in found.trials] == rates
    assert _why(found, SimpleNamespace(min_qps=0.25, max_qps=4.0, max_trials=len(rates))) == why


def test_a_search_cut_short_states_the_resolution_it_reached_not_the_one_asked_for():
    # Doubling brackets 3.3 between 2 and 4 on the third trial; one bisection (2.83) leaves a 41%
    # bracket, far from the 5% asked for.
    found = search_capacity(_up_to(3.3), CapacityCfg(start_qps=1.0, resolution=0.05, max_trials=4))
    assert [t.rate_rps for t in found.trials] == [1.0, 2.0, 4.0, pytest.approx(2 ** 1.5)]
    assert found.resolution == pytest.approx(4.0 / 2 ** 1.5 - 1) and not found.resolved
    record = found.as_dict()
    assert record["resolution"] == pytest.approx(0.414, abs=1e-3) and record["requested_resolution"] == 0.05
    assert record["resolved"] is False and record["lowest_failing_rps"] == 4.0
    done = search_capacity(_up_to(3.3), CapacityCfg(start_qps=1.0, resolution=0.05))
    assert done.resolved and done.resolution <= 0.05 + 1e-12
    assert search_capacity(_up_to(9.0), CapacityCfg(start_qps=1.0, max_qps=4.0)).resolution is None  # never bracketed
