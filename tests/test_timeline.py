"""Batch timelines: a run's results contract as a Chrome / Perfetto trace (Trace Event Format), read
back through a JSON parser and held to the format and to the tables it came from; each request's
lifecycle in order; a preempted request's eviction; older runs without the iterations' requests."""
from __future__ import annotations

import gzip
import itertools
import json
import subprocess
import sys
from collections import defaultdict

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sarathi_lab import LLM
from sarathi_lab.analysis import timeline, timeline_figure
from sarathi_lab.analysis.lifecycle import MEMBERSHIP, request_spans
from sarathi_lab.analysis.runs import Results
from sarathi_lab.analysis.timeline import load_run, trace
from sarathi_lab.engine.scheduler import scheduler_names
from sarathi_lab.harness.compose import run_in_process
from sarathi_lab.harness.results import read_record

TINY = ["experiment=smoke", "logger=none", "workload.num_requests=3", "seq_len=48", "pd_ratio=5", "chunk=16"]
# The smoke run's four requests of 160 tokens in a cache of 18 blocks of 16: decodes preempt.
PREEMPTING = ["experiment=smoke", "logger=none", "executor=sim", "engine.num_kv_blocks=18"]
# What may follow what on a request's track: a decode run ends where iterations ran without the
# request (stalled), where it was evicted, or at its finish.
NEXT = {"queued": {"prefill", "decode"}, "prefill": {"prefill", "decode", "stalled", "preempted"},
        "decode": {"stalled", "preempted"}, "stalled": {"prefill", "decode", "preempted"}, "preempted": {"prefill"}}
TOL_US = 1e-3


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("cpu")
    assert run_in_process(TINY, run_dir) == "ok"
    return run_dir


@pytest.fixture(scope="module")
def preempting_run(tmp_path_factory):
    """A simulated run through the command line, with the run option that writes its trace."""
    run_dir = tmp_path_factory.mktemp("preempting")
    run = subprocess.run([sys.executable, "-m", "sarathi_lab.run", *PREEMPTING, "export.timeline=true",
                          f"hydra.run.dir={run_dir}"], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return run_dir


def _events(payload: dict, ph: str, pid: int | None = None) -> list[dict]:
    return [e for e in payload["traceEvents"] if e["ph"] == ph and (pid is None or e["pid"] == pid)]


def check_trace(payload: dict, run_dir, window: tuple[float, float] | None = None) -> None:
    """The Trace Event Format's structure, and the trace against the run's own tables."""
    assert set(payload) >= {"traceEvents", "otherData"} and payload["displayTimeUnit"] == "ms"
    for e in payload["traceEvents"]:
        assert e["ph"] in ("X", "M", "C") and isinstance(e["pid"], int) and isinstance(e["name"], str)
        if e["ph"] == "X":
            assert {"ph", "ts", "dur", "pid", "tid", "name"} <= set(e) and isinstance(e["tid"], int)
            assert e["dur"] >= 0 and e["ts"] >= 0
        elif e["ph"] == "C":
            assert "ts" in e and all(isinstance(v, (int, float)) for v in e["args"].values())
        else:
            assert e["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index")
    named = {(e["pid"], e.get("tid")) for e in _events(payload, "M") if e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in _events(payload, "X")} <= named, "every track has a name"
    its = pd.read_parquet(run_dir / "iterations.parquet")
    requests = pd.read_parquet(run_dir / "requests.parquet").set_index("request_id")
    if window is not None:
        lo, hi = window[0] * 1e6, (window[0] + window[1]) * 1e6
        assert all(e["ts"] <= hi + TOL_US and e["ts"] + e["dur"] >= lo - TOL_US for e in _events(payload, "X"))
        its = its[(its.start_s + its.duration_s >= window[0]) & (its.start_s <= window[0] + window[1])]
    # The iterations track: one event per row of the table, at its times, with its tokens.
    iterations = sorted(_events(payload, "X", timeline.ENGINE_PID), key=lambda e: e["args"]["iteration"])
    assert [e["args"]["iteration"] for e in iterations] == its.iteration.tolist()
    for e, row in zip(iterations, its.itertuples()):
        assert e["ts"] == pytest.approx(row.start_s * 1e6, abs=TOL_US)
        assert e["dur"] == pytest.approx(row.duration_s * 1e6, abs=2 * TOL_US)
        assert (e["args"]["num_prefill_tokens"], e["args"]["num_decode_tokens"], e["args"]["num_requests"]) == (
            row.num_prefill_tokens, row.num_decode_tokens, row.num_prefill_requests + row.num_decode_requests)
        assert e["args"]["forward_s"] == pytest.approx(row.forward_s)
        if "prefill_chunks" in e["args"] or "prefill_chunk_tokens" in its:
            assert sum(e["args"]["prefill_chunks"].values()) == row.num_prefill_tokens
    # Each request's track: its lifecycle in order, its events never overlapping.
    tracks = defaultdict(list)
    for e in _events(payload, "X", timeline.REQUESTS_PID):
        tracks[e["tid"]].append(e)
    assert set(tracks) <= set(requests.index) and (window is not None or set(tracks) == set(requests.index))
    for rid, events in tracks.items():
        events.sort(key=lambda e: e["ts"])
        for a, b in itertools.pairwise(events):
            assert a["ts"] + a["dur"] <= b["ts"] + TOL_US, (rid, a, b)
            assert b["name"] in NEXT[a["name"]], (rid, a["name"], b["name"])
        if window is None:
            req = requests.loc[rid]
            assert events[0]["name"] == "queued" and events[0]["ts"] == pytest.approx(req.arrival_s * 1e6, abs=TOL_US)
            assert events[-1]["ts"] + events[-1]["dur"] == pytest.approx(req.finish_s * 1e6, abs=2 * TOL_US)
            assert sum(e["name"] == "preempted" for e in events) == req.num_preemptions


def test_a_cpu_run_s_trace_round_trips_through_a_parser(cpu_run):
    payload = json.loads(json.dumps(trace(load_run(cpu_run))))
    check_trace(payload, cpu_run)
    record = read_record(cpu_run / "metrics.json")
    assert payload["otherData"]["source"] == "measured CPU" and payload["otherData"]["clock"].startswith("wall")
    assert payload["otherData"]["not_recorded"] == [] and payload["otherData"]["scheduler"] == "sarathi"
    engine_name = next(e for e in _events(payload, "M", timeline.ENGINE_PID) if e["name"] == "process_name")
    assert "measured CPU" in engine_name["args"]["name"]
    counters = {e["name"] for e in _events(payload, "C")}
    assert counters == {"tokens", "KV blocks in use"}
    tokens = [e for e in _events(payload, "C") if e["name"] == "tokens"]
    assert sum(e["args"]["prefill"] for e in tokens) == record["summary"]["prefill_tokens"]
    # SARATHI splits each 40-token prompt into 16-token chunks: three per request.
    prefills = [e for e in _events(payload, "X", timeline.REQUESTS_PID) if e["name"] == "prefill"]
    assert sorted(e["args"]["tokens"] for e in prefills) == [8] * 3 + [16] * 6


def test_the_iterations_table_names_its_requests_as_its_counts_say(cpu_run, preempting_run):
    for run_dir in (cpu_run, preempting_run):
        its = pd.read_parquet(run_dir / "iterations.parquet")
        assert [sum(t) for t in its.prefill_chunk_tokens] == its.num_prefill_tokens.tolist()
        assert [len(r) for r in its.prefill_request_ids] == its.num_prefill_requests.tolist()
        assert [len(r) for r in its.decode_request_ids] == its.num_decode_tokens.tolist()
        assert [len(r) for r in its.preempted_request_ids] == its.num_preempted.tolist()
        assert (its.num_kv_blocks_used > 0).all()


def test_the_run_option_writes_a_simulated_run_s_trace_with_its_preemptions(preempting_run):
    payload = json.loads((preempting_run / timeline.TRACE).read_text())
    check_trace(payload, preempting_run)
    assert payload["otherData"]["source"].startswith("simulated H100 (")
    assert payload["otherData"]["clock"].startswith("virtual")
    events = sorted(_events(payload, "X", timeline.REQUESTS_PID), key=lambda e: (e["tid"], e["ts"]))
    preempted = [k for k, e in enumerate(events) if e["name"] == "preempted"]
    assert len(preempted) == read_record(preempting_run / "metrics.json")["summary"]["num_preemptions"] > 0
    # Taken back with its prefill recomputed from its first token.
    for k in preempted:
        again = events[k + 1]
        assert again["tid"] == events[k]["tid"] and again["name"] == "prefill"
        assert again["args"]["recompute"] is True and again["args"]["first_token_index"] == 0
    assert max(e["args"]["blocks"] for e in _events(payload, "C") if e["name"] == "KV blocks in use") <= 18


def test_a_rerun_that_only_asks_for_the_trace_keeps_the_finished_run(preempting_run):
    before = (preempting_run / "metrics.json").read_bytes()
    assert run_in_process([*PREEMPTING, "on_existing=skip"], preempting_run) == "skipped"
    assert (preempting_run / "metrics.json").read_bytes() == before


def test_the_command_line_writes_a_window_of_the_trace(cpu_run, tmp_path):
    record = read_record(cpu_run / "metrics.json")
    mid = record["summary"]["makespan_s"] / 2
    out = tmp_path / "t.json.gz"
    run = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", "timeline", str(cpu_run), "--out", str(out),
                          "--start-s", str(mid), "--duration-s", str(mid / 4)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert str(out) in run.stdout and "measured CPU" in run.stdout
    with gzip.open(out, "rt") as f:
        payload = json.load(f)
    check_trace(payload, cpu_run, window=(mid, mid / 4))
    assert 0 < len(_events(payload, "X", timeline.ENGINE_PID)) < record["summary"]["num_iterations"]
    assert payload["otherData"]["window_s"] == pytest.approx([mid, mid * 1.25])


@pytest.mark.parametrize("args, says", [(["{missing}"], "no such directory"),
                                        (["{run}", "--duration-s", "0"], "--duration-s=0.0 is invalid"),
                                        (["{empty}"], "metrics.json is unreadable")])
def test_the_command_line_refuses_in_one_line(args, says, cpu_run, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    paths = {"missing": tmp_path / "nope", "run": cpu_run, "empty": tmp_path / "empty"}
    with pytest.raises(SystemExit) as exit_:
        timeline.main([a.format(**paths) for a in args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and says in err, err


def test_a_run_from_before_the_iterations_named_their_requests_still_reads(cpu_run, tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    for name in ("metrics.json", "requests.parquet"):
        (old / name).write_bytes((cpu_run / name).read_bytes())
    its = pd.read_parquet(cpu_run / "iterations.parquet")
    its.drop(columns=[*MEMBERSHIP, "num_kv_blocks_used"]).to_parquet(old / "iterations.parquet")
    payload = json.loads(json.dumps(trace(load_run(old))))
    check_trace(payload, old)
    assert len(payload["otherData"]["not_recorded"]) == 2
    assert {e["name"] for e in _events(payload, "C")} == {"tokens"}
    names = defaultdict(list)
    for e in sorted(_events(payload, "X", timeline.REQUESTS_PID), key=lambda e: e["ts"]):
        names[e["tid"]].append(e["name"])
    assert set(map(tuple, names.values())) == {("queued", "prefill", "decode")}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheduler=st.sampled_from(scheduler_names()),
       lens=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 24), st.floats(0, 0.01)), min_size=1, max_size=6),
       spare_blocks=st.integers(0, 4))
def test_every_token_an_iteration_computed_is_on_its_request_s_track(scheduler, lens, spare_blocks):
    largest = max(p + n for p, n, _ in lens)
    llm = LLM("tiny", scheduler=scheduler, chunk_size=24, max_batch_size=4, executor="sim", warmup_iters=0,
              block_size=16, num_kv_blocks=-(-largest // 16) + spare_blocks, max_model_len=largest)
    llm.generate([[1] * p for p, _, _ in lens], max_new_tokens=[n for _, n, _ in lens],
                 arrival_times=[a for _, _, a in lens])
    its, requests = pd.DataFrame(llm.metrics.iteration_columns()), pd.DataFrame(llm.metrics.request_rows())
    spans = request_spans(its, requests)
    tokens = defaultdict(int)
    for s in spans:
        tokens[s.name] += s.args.get("tokens", 0)
    assert (tokens["prefill"], tokens["decode"]) == (its.num_prefill_tokens.sum(), its.num_decode_tokens.sum())
    by_request = defaultdict(list)
    for s in spans:
        by_request[s.request_id].append(s)
    for r in requests.itertuples():
        track = by_request[r.request_id]
        assert track[0].name == "queued" and track[0].start_s == r.arrival_s and track[-1].end_s == r.finish_s
        assert all(a.end_s <= b.start_s and b.name in NEXT[a.name] for a, b in itertools.pairwise(track))
        assert sum(s.name == "preempted" for s in track) == r.num_preemptions


def test_the_notebook_s_figure_pairs_sarathi_and_vllm_on_the_same_arrivals(tmp_path):
    sweep = tmp_path / timeline_figure.EXPERIMENT / "multiruns" / "s"
    for k, scheduler in enumerate(["vllm", "sarathi", "sarathi"]):
        qps = 80 if k < 2 else 20  # sarathi alone at 20: no pair there
        assert run_in_process([f"experiment=ci/{timeline_figure.EXPERIMENT}", "executor=sim", f"scheduler={scheduler}",
                               f"workload.qps={qps}"], sweep / str(k)) == "ok"
    pair = timeline_figure.scheduler_pair(Results(tmp_path))
    assert list(pair) == ["sarathi", "vllm"] and {p.run_dir for p in pair.values()} == {sweep / "0", sweep / "1"}
    start, duration = timeline_figure.window(pair, seconds=1e3)
    fig = timeline_figure.draw(pair, start, duration)
    assert len(fig.axes) == 4 and fig.axes[2].get_title("left").startswith("vllm, tiny")
    assert "simulated H100" in fig.axes[0].get_title("left")
    assert fig.axes[-1].get_xlim() == pytest.approx((start, start + duration))
    # Without runs, a sentence for the notebook to show instead.
    assert timeline_figure.scheduler_pair(Results(tmp_path / "none")).startswith("No timeline: ")
