"""The summary derives latencies and throughputs from the records the way their names say."""
from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sarathi_lab import LLM
from sarathi_lab.engine.metrics import STALL, IterationRecord, Metrics, RequestRecord, stalled


def _iteration(i, prefill, decode, duration=1.0, forward=0.9):
    # The 0.1 s that is not the forward: 0.02 s to schedule, 0.05 to prepare, 0.03 to sample.
    return IterationRecord(iteration=i, start=float(i), duration=duration, num_prefill_tokens=prefill,
                           num_decode_tokens=decode, num_prefill_requests=int(prefill > 0),
                           num_decode_requests=decode, kv_tokens_read=10, num_preempted=0, schedule_time=0.02,
                           prepare_time=0.05, forward_time=forward, sample_time=0.03)


def test_summary_from_hand_made_records():
    a = RequestRecord(0, prompt_len=4, arrival=0.0, output_len=3, first_token=1.0, finish=4.0,
                      token_times=[1.0, 2.0, 4.0])
    b = RequestRecord(1, prompt_len=2, arrival=1.0, output_len=2, first_token=3.0, finish=5.0,
                      token_times=[3.0, 5.0])
    m = Metrics([_iteration(0, 4, 0), _iteration(1, 2, 1), _iteration(2, 0, 2), _iteration(3, 0, 1)], [a, b])
    s = m.summary()
    assert s["makespan_s"] == 5.0
    assert s["ttft_p50_s"] == pytest.approx(1.5)  # TTFTs 1 and 2
    assert s["itl_p50_s"] == pytest.approx(2.0)  # gaps 1, 2, 2
    assert s["e2el_p99_s"] == pytest.approx(4.0)
    assert (s["prefill_throughput_tok_s"] == pytest.approx(6 / 5)
            and s["decode_throughput_tok_s"] == pytest.approx(4 / 5))
    assert s["overhead_fraction"] == pytest.approx(0.1)
    assert s["generated_tokens"] == 5


def test_empty_summary_is_nan_not_error():
    s = Metrics().summary()
    assert math.isnan(s["ttft_p50_s"]) and math.isnan(s["total_throughput_tok_s"])


def test_engine_records_are_consistent():
    llm = LLM("tiny", scheduler="sarathi", chunk_size=8, max_batch_size=4, device="cpu", dtype="float32",
              warmup_iters=1)
    outs = llm.generate([[1] * 20, [2] * 5, [3] * 9], max_new_tokens=[4, 6, 3])
    m = llm.metrics
    assert sum(i.num_prefill_tokens for i in m.iterations) == 34  # warm-up excluded
    # Each request's first token comes from its last prefill chunk; the rest from decodes.
    assert sum(i.num_decode_tokens for i in m.iterations) == sum(len(o) - 1 for o in outs)
    for r, out in zip(m.requests, outs):
        assert r.output_len == len(out) == len(r.token_times)
        assert r.arrival <= r.first_scheduled <= r.first_token <= r.finish == r.token_times[-1]
        assert r.token_times == sorted(r.token_times)
    starts = [i.start for i in m.iterations]
    assert starts == sorted(starts)
    for i in m.iterations:
        parts = (i.schedule_time, i.prepare_time, i.forward_time, i.sample_time)
        # The parts are disjoint stretches of the iteration, read off the same clock.
        assert all(p > 0 for p in parts) and sum(parts) <= i.duration + 1e-9


def test_a_run_stopped_before_every_request_arrived_counts_the_others_unfinished():
    # Arrivals 1 s apart, stopped at the third iteration: most requests never arrived, and so were
    # never recorded, yet they were submitted to the run and did not finish.
    llm = LLM("tiny", executor="sim", scheduler="sarathi", chunk_size=64, max_batch_size=4)
    n, seen = 10, []

    def stop(record):
        seen.append(record)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        llm.generate([[1] * 8] * n, max_new_tokens=2, arrival_times=[float(i) for i in range(n)], on_iteration=stop)
    s = llm.metrics.summary()
    assert len(llm.metrics.requests) < n
    assert s["num_requests"] + s["num_unfinished"] == n and s["num_unfinished"] > 0


def test_a_stopped_run_s_token_rates_are_over_the_window_it_measured():
    # One short request finishes at once while seven long ones keep the engine busy until the stop:
    # the rates count every token computed, so they run over the whole window, not to the one finish.
    llm = LLM("tiny", executor="sim", scheduler="sarathi", chunk_size=64, max_batch_size=8)
    seen = []

    def stop(record):
        seen.append(record)
        if len(seen) == 100:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        llm.generate([[1] * 8] + [[1] * 512] * 7, max_new_tokens=[2] + [300] * 7, on_iteration=stop)
    s = llm.metrics.summary()
    assert s["num_requests"] == 1
    assert s["makespan_s"] == pytest.approx(seen[-1].start + seen[-1].duration)
    assert s["total_throughput_tok_s"] == pytest.approx((s["prefill_tokens"] + s["decode_tokens"]) / s["makespan_s"])


def test_the_iteration_columns_are_the_rows_by_column():
    """iterations.parquet is built from columns; they hold what the rows hold, in the same order."""
    import pandas as pd

    m = Metrics([_iteration(0, 4, 0), _iteration(1, 2, 1, duration=0.5), _iteration(2, 0, 2, forward=0.25)])
    by_rows, by_columns = pd.DataFrame(m.iteration_rows()), pd.DataFrame(m.iteration_columns())
    pd.testing.assert_frame_equal(by_columns, by_rows)
    assert list(by_columns.columns) == list(m.iteration_rows()[0]) and by_columns.num_tokens.tolist() == [4, 3, 2]
    pd.testing.assert_frame_equal(pd.DataFrame(Metrics().iteration_columns()), pd.DataFrame(Metrics().iteration_rows()))


def test_a_stall_is_judged_against_its_own_kind():
    # A prefill many times a decode is its work; a decode many times the other decodes is a pause.
    seconds = [0.03, 0.031, 0.029, 0.03, 1.2, 0.5, 0.45, 0.03 * (STALL - 0.5)]
    kinds = ["decode"] * 5 + ["prefill", "prefill", "decode"]
    assert stalled(seconds, kinds).tolist() == [False, False, False, False, True, False, False, False]


@given(st.floats(1e-4, 1.0), st.lists(st.floats(1.0, STALL * 0.99), min_size=2, max_size=40),
       st.floats(STALL * 1.01, 100.0))
def test_one_pause_among_iterations_of_like_cost_is_the_only_stall(base, spreads, factor):
    # Iterations within STALL of each other are never stalls; one past STALL times the slowest always is.
    times = [base * s for s in spreads]
    mask = stalled([*times, max(times) * factor], ["hybrid"] * (len(times) + 1))
    assert mask.tolist() == [False] * len(times) + [True]
