"""Workload generators: the paper's P/D split, length distributions, arrivals, and trace CSVs."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sarathi_lab.config import ConfigError
from sarathi_lab.harness.schema import WorkloadCfg
from sarathi_lab.harness.workloads import (
    build_workload,
    read_trace,
    read_trace_lengths,
    resolve_trace_path,
    split_length,
)

VOCAB = 4096


def _replay(path, **kw):
    """A trace replayed as recorded: every row, its own times."""
    return WorkloadCfg(**{"kind": "trace", "path": str(path), "num_requests": None, "qps": None} | kw)


def _build(seq_len=640, pd_ratio=9, seed=0, context=None, **kw):
    return build_workload(WorkloadCfg(**{"kind": "synthetic"} | kw), seq_len, pd_ratio, seed, VOCAB, context)


@pytest.mark.parametrize("seq_len,pd_ratio,expected", [(640, 9, (576, 64)), (1024, 1, (512, 512)),
                                                      (100, 3, (75, 25)), (2, 1, (1, 1))])
def test_split_keeps_sum_and_ratio(seq_len, pd_ratio, expected):
    assert split_length(seq_len, pd_ratio) == expected


@pytest.mark.parametrize("seq_len,pd_ratio", [(8, 100), (8, 0.01), (1, 1)])
def test_split_refuses_an_empty_prompt_or_decode(seq_len, pd_ratio):
    with pytest.raises(ConfigError, match=rf"^seq_len={seq_len} is invalid with pd_ratio="):
        split_length(seq_len, pd_ratio)


def test_synthetic_requests_have_the_papers_shape():
    w = _build(num_requests=5)
    assert [len(p) for p in w.prompts] == [576] * 5 and w.decode_lens == [64] * 5
    assert w.arrival_times is None
    assert all(0 <= t < VOCAB for p in w.prompts for t in p)
    assert w.prompts[0] != w.prompts[1], "identical prompts would let a prefix cache cheat"


def test_stagger_shortens_the_first_requests_decodes_one_token_apart():
    w = _build(num_requests=5, stagger=3)
    assert w.decode_lens == [64, 63, 62, 64, 64] and [len(p) for p in w.prompts] == [576] * 5
    with pytest.raises(ConfigError,
                       match=r"^workload.stagger=65 is invalid: seq_len=640 and pd_ratio=9 give 64 decode"):
        _build(stagger=65)


def test_same_seed_same_workload_other_seed_other_tokens():
    assert _build(seed=3) == _build(seed=3)
    assert _build(seed=3).prompts != _build(seed=4).prompts


@pytest.mark.parametrize("kind", ["uniform", "zipf"])
def test_length_distributions_stay_in_bounds(kind):
    w = _build(kind=kind, num_requests=400, min_tokens=100, seq_len=1000, pd_ratio=4)
    totals = np.array([len(p) + d for p, d in zip(w.prompts, w.decode_lens)])
    assert totals.min() >= 100 and totals.max() <= 1000
    ratios = np.array([len(p) / d for p, d in zip(w.prompts, w.decode_lens)])
    assert np.allclose(ratios, 4, rtol=0.05)


def test_zipf_favours_short_requests_uniform_does_not():
    def median(kind):
        w = _build(kind=kind, num_requests=2000, min_tokens=100, seq_len=1100, pd_ratio=4, theta=1.2)
        return np.median([len(p) + d for p, d in zip(w.prompts, w.decode_lens)])
    assert median("zipf") < 350
    assert median("uniform") > 500


def test_min_tokens_above_seq_len_is_refused():
    with pytest.raises(ConfigError, match=r"^workload.min_tokens=700 is invalid"):
        _build(kind="uniform", min_tokens=700, seq_len=640)


def test_poisson_arrivals_match_the_rate_and_leave_lengths_alone():
    burst = _build(kind="uniform", num_requests=2000, min_tokens=64)
    poisson = _build(kind="uniform", num_requests=2000, min_tokens=64, arrival="poisson", qps=4.0)
    times = np.array(poisson.arrival_times)
    assert times[0] == 0 and np.all(np.diff(times) >= 0)
    assert np.mean(np.diff(times)) == pytest.approx(0.25, rel=0.1)
    assert poisson.prompts == burst.prompts and poisson.decode_lens == burst.decode_lens


def test_the_shipped_trace_loads():
    cfg = _replay("data/traces/sample.csv")
    w = build_workload(cfg, seq_len=1, pd_ratio=1, seed=0, vocab_size=VOCAB)  # lengths come from the trace
    assert w.num_requests == 32 and w.arrival_times[0] == 0.0
    assert np.all(np.diff(w.arrival_times) >= 0)
    half = build_workload(replace(cfg, time_scale=0.5, num_requests=4), 1, 1, 0, VOCAB)
    assert half.num_requests == 4 and half.arrival_times == pytest.approx([t / 2 for t in w.arrival_times[:4]])


@pytest.mark.parametrize("row,message", [
    ("0.5,abc,10", r"line 3: num_prefill_tokens='abc' is invalid"),
    ("0.5,10,0", r"line 3: num_decode_tokens='0' is invalid"),
    ("nan,10,10", r"line 3: arrived_at='nan' is invalid"),
    ("0.5,10", r"line 3: num_decode_tokens=None is invalid"),
])
def test_a_malformed_trace_row_names_its_line(tmp_path, row, message):
    path = tmp_path / "t.csv"
    path.write_text(f"arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,5,5\n{row}\n")
    with pytest.raises(ConfigError, match=message):
        read_trace(_replay(path))


def test_trace_lengths_draw_the_trace_s_lengths_and_arrivals_at_the_rate():
    cfg = WorkloadCfg(kind="trace_lengths", path="sim/data/traces/arxiv_summarization.csv", num_requests=400,
                      arrival="poisson", qps=4.0)
    w = build_workload(cfg, seq_len=1, pd_ratio=1, seed=0, vocab_size=VOCAB, context=4096)
    rows = {tuple(r) for r in np.loadtxt(resolve_trace_path(cfg.path), delimiter=",", skiprows=1, dtype=int).tolist()}
    pairs = [(len(p), d) for p, d in zip(w.prompts, w.decode_lens)]
    assert w.num_requests == 400 and set(pairs) <= rows and len(set(pairs)) > 300
    # Sarathi-Serve's arxiv_summarization: prompt median 2730, decode median 167 (traces/README.md).
    assert 2300 < np.median([p for p, _ in pairs]) < 3100 and 120 < np.median([d for _, d in pairs]) < 220
    assert w.arrival_times == pytest.approx(
        build_workload(replace(cfg, kind="uniform"), 640, 9, 0, VOCAB).arrival_times)
    assert 3.0 < 400 / w.arrival_times[-1] < 5.0


def test_trace_lengths_need_only_the_length_columns_and_repeat_rows_when_asked_for_more(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n5,6\n7,8\n")
    cfg = WorkloadCfg(kind="trace_lengths", path=str(path), num_requests=5)
    lengths = read_trace_lengths(cfg, None, np.random.default_rng(0))
    assert len(lengths) == 5 and set(lengths) == {(5, 6), (7, 8)}
    assert sorted(read_trace_lengths(replace(cfg, num_requests=2), None, np.random.default_rng(0))) == [(5, 6), (7, 8)]
    with pytest.raises(ConfigError, match=r"line 1 lacks column arrived_at"):
        read_trace(_replay(path))


def test_a_trace_without_the_needed_columns_is_refused(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("time,prompt,decode\n0,5,5\n")
    with pytest.raises(ConfigError, match=r"line 1 lacks column arrived_at"):
        read_trace(_replay(path))


def test_the_shipped_trace_loads_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # as after `pip install .`: the sample ships inside the package
    assert build_workload(_replay("data/traces/sample.csv"), 1, 1, 0, VOCAB).num_requests == 32


def test_a_trace_saved_with_a_byte_order_mark_loads(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"\xef\xbb\xbfarrived_at,num_prefill_tokens,num_decode_tokens\r\n0.0,5,6\r\n")
    assert read_trace(_replay(path)) == ([(5, 6)], [0.0])


def test_a_trace_that_is_not_utf8_is_one_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,5,5\xff\n")
    with pytest.raises(ConfigError,
                       match=r"^workload.path='.*t.csv' is invalid: line 2 is not UTF-8 text \(byte 0xff\)$"):
        read_trace(_replay(path))


def test_a_trace_request_beyond_the_context_is_refused_at_its_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,5,5\n1.0,3000000000000,5\n")
    with pytest.raises(ConfigError, match=r"line 3: a request of 3000000000005 tokens is invalid: more than the "
                                          r"model's context of 2048 tokens$"):
        build_workload(_replay(path), 1, 1, 0, VOCAB, context=2048)


def test_sizes_are_refused_by_arithmetic_before_any_prompt_exists():
    # Generating either would take the machine's memory; the checks must come first.
    with pytest.raises(ConfigError, match=r"^seq_len=1000000000000 is invalid: more than the model's context"):
        _build(seq_len=10**12, context=2048)
    with pytest.raises(ConfigError, match=r"^workload.num_requests=10000000000 is invalid: its prompts need up to"):
        _build(num_requests=10**10, seq_len=2048, context=2048)


def test_a_time_scale_that_overflows_the_arrival_times_is_refused(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,5,5\n1e300,5,5\n")
    with pytest.raises(ConfigError, match=r"^workload.time_scale=1e\+300 is invalid: it scales"):
        read_trace(_replay(path, time_scale=1e300))


@pytest.mark.parametrize("key", ["qps", "theta", "time_scale", "cv", "length_scale"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_times_and_shapes_are_refused(key, value):
    with pytest.raises(ConfigError, match=rf"^workload.{key}={value} is invalid: must be a finite number$"):
        WorkloadCfg(kind="zipf", **{key: value})


def test_gamma_arrivals_keep_the_rate_and_cv_sets_burstiness():
    def gaps(cv):
        w = _build(kind="uniform", num_requests=4000, min_tokens=64, arrival="gamma", qps=4.0, cv=cv)
        return np.diff(w.arrival_times)
    for cv in (0.5, 1.0, 3.0):
        g = gaps(cv)
        assert np.mean(g) == pytest.approx(0.25, rel=0.1)
        assert np.std(g) / np.mean(g) == pytest.approx(cv, rel=0.15)


def test_one_seed_gives_one_arrival_pattern_scaled_by_the_rate():
    slow = _build(num_requests=50, arrival="gamma", qps=1.0, cv=2.0)
    fast = _build(num_requests=50, arrival="gamma", qps=4.0, cv=2.0)
    assert fast.arrival_times == pytest.approx([t / 4 for t in slow.arrival_times])


def test_max_concurrency_reaches_the_workload():
    assert _build(max_concurrency=3).max_concurrency == 3
    assert _build().max_concurrency is None
    with pytest.raises(ConfigError, match=r"^workload.max_concurrency=0 is invalid: must be > 0$"):
        WorkloadCfg(kind="synthetic", max_concurrency=0)


def test_length_scale_scales_trace_lengths_to_at_least_one_token(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,100,3\n1.0,40,1\n")
    lengths, times = read_trace(_replay(path, length_scale=0.25))
    assert lengths == [(25, 1), (10, 1)] and times == [0.0, 1.0]
    with pytest.raises(ConfigError, match=r"^workload.length_scale=1e\+308 is invalid: it scales"):
        read_trace(_replay(path, length_scale=1e308))
