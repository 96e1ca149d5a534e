"""Serving metrics (Sarathi-Serve, vLLM bench serve): scheduling delay, TPOT, goodput under SLOs,
and the saturation flag, on hand-made records and on engine runs over a virtual clock."""
from __future__ import annotations

import math

import numpy as np
import pytest

from sarathi_lab.engine.block_manager import BlockManager
from sarathi_lab.engine.clock import VirtualClock
from sarathi_lab.engine.llm_engine import LLMEngine
from sarathi_lab.engine.metrics import SLO, Metrics, RequestRecord
from sarathi_lab.engine.scheduler import make_scheduler
from sarathi_lab.engine.sequence import SamplingParams, Sequence
from tests.clocked import ClockedExecutor


def _request(i, arrival, scheduled, times):
    return RequestRecord(i, prompt_len=8, arrival=arrival, output_len=len(times), first_scheduled=scheduled,
                         first_token=times[0], finish=times[-1], token_times=list(times))


# Four finished requests, every figure below worked out by hand.
TABLE = [
    _request(0, 0.0, 0.5, [1.0, 1.1, 1.2]),        # ttft 1.0, tpot 0.1, e2e 1.2, tbts .1 .1
    _request(1, 1.0, 1.0, [1.5, 2.5]),             # ttft 0.5, tpot 1.0, e2e 1.5, tbt 1.0
    _request(2, 2.0, 4.0, [4.2]),                  # ttft 2.2, one token: no tpot, no tbt
    _request(3, 3.0, 3.1, [3.3, 3.5, 3.7, 3.9]),   # ttft 0.3, tpot 0.2, e2e 0.9
]


def test_per_request_figures_by_hand():
    r0, r1, r2, r3 = TABLE
    assert r0.sched_delay == 0.5 and r2.sched_delay == 2.0
    assert r0.tpot == pytest.approx(0.1) and r1.tpot == pytest.approx(1.0) and math.isnan(r2.tpot)
    assert r3.tpot == pytest.approx(0.2)
    s = Metrics([], TABLE).summary()
    # Scheduling delays 0.5, 0.0, 2.0, 0.1: median 0.3.
    assert s["sched_delay_p50_s"] == pytest.approx(0.3)
    # TPOTs 0.1, 1.0, 0.2 (the one-token request has none): median 0.2.
    assert s["tpot_p50_s"] == pytest.approx(0.2)
    # e2e per output token: 0.4, 0.75, 2.2, 0.225: median 0.575.
    assert s["normalized_latency_p50_s_per_token"] == pytest.approx(0.575)
    assert s["request_throughput_rps"] == pytest.approx(4 / 4.2)


@pytest.mark.parametrize("slo, met", [
    (SLO(ttft_s=1.0), [0, 1, 3]),
    (SLO(tpot_s=0.5), [0, 2, 3]),
    (SLO(ttft_s=1.0, tpot_s=0.5), [0, 3]),
    (SLO(e2e_s=1.3), [0, 3]),
    (SLO(tbt_p99_s=0.15), [0, 2]),   # request 3's gaps are 0.2
    (SLO(), [0, 1, 2, 3]),
])
def test_goodput_counts_the_requests_that_met_every_target(slo, met):
    s = Metrics([], TABLE).summary(slo)
    assert [r.request_id for r in TABLE if r.meets(slo)] == met
    assert s["slo_attainment"] == len(met) / 4
    assert s["goodput_rps"] == pytest.approx(len(met) / 4.2)


def _fixed_cost(batch) -> float:
    """Each iteration takes 1 ms per token plus 5 ms, on the virtual clock."""
    return 5e-3 + 1e-3 * batch.num_tokens


def _serve(qps: float, n: int = 200, seed: int = 0) -> Metrics:
    clock = VirtualClock()
    scheduler = make_scheduler("sarathi_serve", BlockManager(4096, 16), max_batch_size=8, chunk_size=64,
                               max_model_len=64)
    engine = LLMEngine(scheduler, ClockedExecutor(clock, _fixed_cost, token=1), clock)
    gaps = np.random.default_rng(seed).exponential(1 / qps, n)
    arrivals = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    seqs = [Sequence(i, [1] * 48, 16, float(t)) for i, t in enumerate(arrivals)]
    metrics = Metrics()
    engine.run(seqs, metrics, SamplingParams(ignore_eos=True))
    return metrics


def test_saturation_flag_fires_on_an_overloaded_run_only():
    # One request is 48 prompt + 16 decode tokens; at batch 8 the engine serves about 25 requests/s.
    stable, overloaded = _serve(qps=5.0).summary(), _serve(qps=80.0).summary()
    assert stable["saturated"] == 0.0 and abs(stable["queue_growth_requests"]) < 4
    assert overloaded["saturated"] == 1.0 and overloaded["queue_growth_requests"] > 50
    assert overloaded["sched_delay_p50_s"] > 10 * stable["sched_delay_p50_s"]


def test_a_request_due_while_the_cap_is_reached_mid_step_arrives_when_it_is_sent():
    # Cap 2. R0 (9 tokens, 1 new) runs alone from 0 to 14 ms and leaves. R1, due at 1 ms, joins one
    # in the system: sent on time. R2, due at 2 ms, finds R0 and R1 there: sent when R0 leaves, 14 ms.
    clock = VirtualClock()
    scheduler = make_scheduler("sarathi_serve", BlockManager(100, 4), max_batch_size=4, chunk_size=64,
                               max_model_len=64)
    metrics = Metrics()
    seqs = [Sequence(0, [1] * 9, 1, 0.0), Sequence(1, [2] * 3, 1, 0.001), Sequence(2, [3] * 3, 1, 0.002)]
    LLMEngine(scheduler, ClockedExecutor(clock, _fixed_cost, token=1), clock).run(
        seqs, metrics, SamplingParams(ignore_eos=True), max_concurrency=2)
    arrivals = [r.arrival for r in sorted(metrics.requests, key=lambda r: r.request_id)]
    assert arrivals == [0.0, 0.001, pytest.approx(0.014)]


def test_all_at_once_is_never_called_saturated():
    records = [RequestRecord(i, 4, 0.0, queue_at_arrival=i) for i in range(50)]
    assert Metrics([], records).summary()["saturated"] == 0.0


def test_max_concurrency_caps_requests_in_the_system():
    clock = VirtualClock()
    scheduler = make_scheduler("sarathi_serve", BlockManager(4096, 16), max_batch_size=8, chunk_size=64,
                               max_model_len=64)
    engine = LLMEngine(scheduler, ClockedExecutor(clock, _fixed_cost, token=1), clock)
    in_system = []
    seqs = [Sequence(i, [1] * 20, 6, 0.0) for i in range(12)]
    metrics = Metrics()
    engine.run(seqs, metrics, SamplingParams(ignore_eos=True),
               on_iteration=lambda r: in_system.append(len(scheduler.waiting) + len(scheduler.running)),
               max_concurrency=3)
    assert max(in_system) <= 3 and all(r.finish is not None for r in metrics.requests)
    # A request held back by the cap arrives when it is sent: its latency starts then, not at 0.
    arrivals = sorted(r.arrival for r in metrics.requests)
    assert arrivals[:3] == [0.0, 0.0, 0.0] and arrivals[3] > 0
