"""metrics.json compares key by key with `vllm bench serve --save-result`'s JSON: the names are read
from vLLM's own benchmarks/serve.py (the installed CPU build), and the values from its own
calculate_metrics over the same requests' timings. Skipped where vLLM is not installed."""
from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import pytest

from sarathi_lab.engine.metrics import (
    VLLM_LATENCIES,
    VLLM_RESULT_KEYS,
    VLLM_STATS,
    Metrics,
    RequestRecord,
    vllm_names,
)


def _serve_source() -> str:
    try:
        spec = importlib.util.find_spec("vllm.benchmarks.serve")
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed (pip install -e '.[vllm]')")
    return Path(spec.origin).read_text()


def _result_names(source: str, percentiles=("99",)) -> set[str]:
    """The keys bench serve's JSON gets: its latencies' statistics (process_one_metric, spelled as
    its f-strings spell them, at its default --metric-percentiles) and its result dict's keys."""
    latencies = re.findall(r'process_one_metric\(\s*"(\w+)"', source)
    stats = re.findall(r'result\[f"(\w+)_\{metric_attribute_name\}_ms"\]', source)
    assert {"ttft", "tpot", "itl", "e2el"} <= set(latencies) and stats == ["mean", "median", "std"], \
        "vLLM's serve.py no longer names its statistics as this test reads them"
    assert 'result[f"p{p_word}_{metric_attribute_name}_ms"]' in source
    names = {f"{stat}_{m}_ms" for m in latencies for stat in [*stats, *(f"p{p}" for p in percentiles)]}
    block = source[source.index("if isinstance(metrics, BenchmarkMetrics):"):]
    block = block[:block.index("else:")]
    return names | set(re.findall(r'^\s+"(\w+)":', block, re.MULTILINE))


def test_the_summary_names_are_vllms_own():
    names = _result_names(_serve_source())
    ours = vllm_names()
    assert set(ours) <= names, f"not vLLM's: {sorted(set(ours) - names)}"
    # Every statistic vLLM reports for the four latencies by default (--metric-percentiles 99).
    assert {n for n in names if re.fullmatch(rf"({'|'.join(VLLM_STATS)})_({'|'.join(VLLM_LATENCIES)})_ms", n)} \
        == set(ours)
    assert set(VLLM_RESULT_KEYS) <= names, f"not vLLM's keys: {sorted(set(VLLM_RESULT_KEYS) - names)}"
    summary = Metrics([], TABLE).summary()
    assert set(ours) | set(VLLM_RESULT_KEYS.values()) <= set(summary)


def _request(i, arrival, times, prompt_len=8):
    return RequestRecord(i, prompt_len=prompt_len, arrival=arrival, output_len=len(times),
                         first_scheduled=arrival, first_token=times[0], finish=times[-1], token_times=list(times))


# Finished requests of uneven gaps, one of a single token (no TPOT, no ITL: vLLM leaves it out too).
TABLE = [
    _request(0, 0.0, [1.0, 1.1, 1.35]),
    _request(1, 0.4, [1.5, 2.5]),
    _request(2, 1.0, [4.2]),
    _request(3, 2.0, [3.3, 3.5, 3.8, 3.9, 4.6], prompt_len=30),
    _request(4, 2.5, [2.9, 3.0, 3.05, 3.6]),
]


@pytest.mark.e2e
def test_the_values_match_vllms_calculate_metrics():
    _serve_source()
    serve = pytest.importorskip("vllm.benchmarks.serve")
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

    summary = Metrics([], TABLE).summary()
    outputs = [RequestFuncOutput(success=True, latency=r.e2e, output_tokens=r.output_len, ttft=r.ttft,
                                 itl=[b - a for a, b in zip(r.token_times, r.token_times[1:])],
                                 prompt_len=r.prompt_len, start_time=r.arrival) for r in TABLE]
    theirs, _ = serve.calculate_metrics(input_requests=[], outputs=outputs, dur_s=summary["makespan_s"],
                                        tokenizer=None, selected_percentiles=[99.0], goodput_config_dict={})
    for latency in VLLM_LATENCIES:
        for stat in ("mean", "median", "std"):
            key = f"{stat}_{latency}_ms"
            assert summary[key] == pytest.approx(getattr(theirs, key)), key
        ((p, p99),) = getattr(theirs, f"percentiles_{latency}_ms")
        assert p == 99 and summary[f"p99_{latency}_ms"] == pytest.approx(p99), latency
    fields = {"completed": theirs.completed, "duration": summary["makespan_s"],
              "total_output_tokens": theirs.total_output,
              "request_throughput": theirs.request_throughput, "output_throughput": theirs.output_throughput}
    for their_key, our_key in VLLM_RESULT_KEYS.items():
        assert summary[our_key] == pytest.approx(fields[their_key]), their_key
    # The seconds-based names stay beside them, the same numbers in another unit.
    assert summary["p99_itl_ms"] == pytest.approx(summary["itl_p99_s"] * 1e3)


def test_no_value_is_nan_not_vllms_zero():
    summary = Metrics([], [_request(0, 0.0, [1.0])]).summary()
    assert all(math.isnan(summary[f"{stat}_tpot_ms"]) for stat in VLLM_STATS), "a one-token request has no TPOT"
    assert summary["mean_ttft_ms"] == pytest.approx(1000.0)
