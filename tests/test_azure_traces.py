"""The Azure LLM inference traces (workload=azure_conv / azure_code): the shipped files, their replay
in order at a chosen rate (the gaps' ratios kept), the rows a run takes, a capacity search on them,
and the refusals of bad knobs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from sarathi_lab.config import ConfigError
from sarathi_lab.harness import CONF_DIR, PACKAGE_DIR
from sarathi_lab.harness.compose import compose_config, run_in_process
from sarathi_lab.harness.preflight import preflight
from sarathi_lab.harness.schema import parse_config
from sarathi_lab.harness.workloads import arrival_times, arrivals_at, build_workload, mean_rate_rps, scaled_to_rate

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 32000
# The rows and the long tail vidur's processed copies hold (sim/data/traces/README.md).
TRACES = {"azure_conv": 19_366, "azure_code": 8_819}
SIM = ["executor=sim", "model=mistral-7b", "engine.sim_device=a100", "logger=none", "engine.max_model_len=8192"]


def _recorded(name: str) -> pd.DataFrame:
    return pd.read_csv(PACKAGE_DIR / "sim" / "data" / "traces" / f"{name}.csv")


def _workload(*overrides: str, context: int | None = 32768):
    run = parse_config(compose_config(list(overrides)))
    return build_workload(run.workload, run.seq_len, run.pd_ratio, run.seed, VOCAB, context)


@pytest.mark.parametrize("name,rows", TRACES.items())
def test_the_shipped_traces_hold_every_request_with_non_decreasing_arrivals(name, rows):
    trace = _recorded(name)
    assert list(trace.columns) == ["arrived_at", "num_prefill_tokens", "num_decode_tokens"] and len(trace) == rows
    assert trace.arrived_at.iloc[0] == 0 and (trace.arrived_at.diff().dropna() >= 0).all()
    assert (trace[["num_prefill_tokens", "num_decode_tokens"]] >= 1).all().all()
    # The whole trace, as recorded, through the workload: the same rows in the same order.
    w = _workload(f"workload={name}", "workload.num_requests=null")
    assert w.num_requests == rows and w.decode_lens == trace.num_decode_tokens.tolist()
    assert [len(p) for p in w.prompts] == trace.num_prefill_tokens.tolist()
    assert w.arrival_times == pytest.approx(trace.arrived_at.tolist())
    assert w.recorded_rate_rps == pytest.approx((rows - 1) / trace.arrived_at.iloc[-1])


@pytest.mark.parametrize("name", TRACES)
def test_a_target_rate_scales_every_gap_by_one_factor(name):
    recorded = _recorded(name).arrived_at.iloc[:300].to_numpy()
    w = _workload(f"workload={name}", "workload.num_requests=300", "workload.qps=7.5")
    times = np.asarray(w.arrival_times)
    assert times[0] == 0 and (len(times) - 1) / times[-1] == pytest.approx(7.5)
    factor = np.diff(times) / np.diff(recorded)
    assert factor == pytest.approx(np.full_like(factor, factor[0]))  # the burstiness kept
    assert w.recorded_rate_rps == pytest.approx(299 / recorded[-1])


@given(gaps=st.lists(st.floats(0, 1e3), min_size=1, max_size=40).filter(lambda g: sum(g) > 1e-6),
       qps=st.floats(1e-3, 1e3))
def test_scaled_to_rate_reaches_the_rate_and_keeps_the_ratios_of_the_gaps(gaps, qps):
    times = np.concatenate([[0.0], np.cumsum(gaps)])
    scaled = np.asarray(scaled_to_rate(times.tolist(), qps))
    assert scaled[0] == 0 and mean_rate_rps(scaled.tolist()) == pytest.approx(qps, rel=1e-9)
    # A gap is a difference of two arrival times: float64 leaves it uncertain by a few ulps of the last
    # one, whatever its own size, so a tiny gap beside a long trace is held to that, not to 1e-9.
    ulps = 8 * np.finfo(float).eps * scaled[-1] * times[-1]
    assert np.diff(scaled) * times[-1] == pytest.approx(np.diff(times) * scaled[-1], rel=1e-9, abs=max(ulps, 1e-9))


def test_scaled_to_rate_leaves_one_request_and_refuses_requests_all_at_once():
    assert scaled_to_rate([0.0], 5.0) == [0.0] and mean_rate_rps([0.0]) is None
    with pytest.raises(ValueError, match="all equal"):
        scaled_to_rate([0.0, 0.0], 5.0)


def test_num_requests_and_offset_take_the_rows_after_the_offset_from_their_own_start():
    trace = _recorded("azure_code").iloc[100:150]
    w = _workload("workload=azure_code", "workload.offset=100", "workload.num_requests=50")
    assert [len(p) for p in w.prompts] == trace.num_prefill_tokens.tolist()
    assert w.decode_lens == trace.num_decode_tokens.tolist()
    assert w.arrival_times == pytest.approx((trace.arrived_at - trace.arrived_at.iloc[0]).tolist())
    assert w.arrival_times[0] == 0.0


def test_num_requests_past_the_rows_replays_the_rows_there_are_and_says_so(caplog):
    # Not refused: experiment=smoke's num_requests=4 applies to a one-row trace put in its place too.
    with caplog.at_level("WARNING"):
        w = _workload("workload=azure_code", "workload.offset=8800", "workload.num_requests=100")
    assert w.num_requests == 19 and w.decode_lens == _recorded("azure_code").num_decode_tokens.iloc[8800:].tolist()
    assert "has 19 rows after workload.offset=8800: replaying those, fewer than workload.num_requests=100" in \
        caplog.text


def test_a_capacity_trial_replays_the_trace_at_its_rate_and_other_workloads_as_before():
    run = parse_config(compose_config(["workload=azure_conv", "workload.num_requests=40"]))
    w = build_workload(run.workload, run.seq_len, run.pd_ratio, run.seed, VOCAB, 32768)
    at = np.asarray(arrivals_at(run.workload, w, 2.0, run.seed))
    assert 39 / at[-1] == pytest.approx(2.0) and at == pytest.approx(scaled_to_rate(w.arrival_times, 2.0))
    uniform = parse_config(compose_config(["workload=uniform", "workload.arrival=gamma", "workload.num_requests=9"]))
    assert arrivals_at(uniform.workload, None, 2.0, 0) == arrival_times(uniform.workload, 2.0, 0)


@pytest.mark.parametrize("name", TRACES)
def test_a_simulated_serve_run_replays_each_trace(tmp_path, name):
    assert run_in_process([*SIM, f"workload={name}", "workload.num_requests=12", "workload.qps=4"], tmp_path) == "ok"
    trace = _recorded(name).iloc[:12]
    served = pd.read_parquet(tmp_path / "requests.parquet").sort_values("request_id")
    assert served.prompt_tokens.tolist() == trace.num_prefill_tokens.tolist()
    assert served.output_tokens.tolist() == trace.num_decode_tokens.tolist()
    gaps = np.diff(served.arrival_s)
    assert 11 / served.arrival_s.iloc[-1] == pytest.approx(4.0)
    assert gaps * trace.arrived_at.iloc[-1] == pytest.approx(np.diff(trace.arrived_at) * served.arrival_s.iloc[-1])
    record = json.loads((tmp_path / "metrics.json").read_text())
    assert record["config"]["workload"] == "trace" and record["summary"]["num_requests"] == 12


def test_a_capacity_search_on_a_trace_scales_its_arrivals_to_each_rate(tmp_path):
    overrides = [*SIM, "workload=azure_conv", "workload.num_requests=16", "task=capacity", "scheduler=sarathi_serve",
                 "slo=strict", "capacity.max_trials=3", "capacity.start_qps=2"]
    assert run_in_process(overrides, tmp_path) == "ok"
    recorded = _recorded("azure_conv").arrived_at.iloc[:16].to_numpy()
    found = json.loads((tmp_path / "capacity.json").read_text())
    assert len(found["trials"]) == 3
    for trial in found["trials"]:
        arrivals = pd.read_parquet(tmp_path / trial["run_dir"] / "requests.parquet").sort_values("request_id").arrival_s
        assert 15 / arrivals.iloc[-1] == pytest.approx(trial["rate_rps"])
        assert np.diff(arrivals) * recorded[-1] == pytest.approx(np.diff(recorded) * arrivals.iloc[-1])
    summary = json.loads((tmp_path / "metrics.json").read_text())["summary"]
    assert summary["trace_rate_rps"] == pytest.approx(15 / recorded[-1])
    if found["capacity_rps"] is not None:
        assert summary["capacity_rate_scale"] == pytest.approx(found["capacity_rps"] / summary["trace_rate_rps"])


@pytest.mark.parametrize("overrides,message", [
    (["workload=azure_conv", "workload.num_requests=0"], r"^workload.num_requests=0 is invalid: must be > 0$"),
    (["workload=azure_conv", "workload.offset=-1"], r"^workload.offset=-1 is invalid: must be >= 0$"),
    (["workload=azure_conv", "workload.qps=0"], r"^workload.qps=0 is invalid: must be > 0$"),
    (["workload=azure_conv", "workload.qps=nan"], r"^workload.qps=nan is invalid: must be a finite number$"),
    (["workload=azure_conv", "workload.qps=2", "workload.time_scale=0.5"],
     r"^workload.time_scale=0.5 is invalid with workload.qps=2: both set the replayed trace's rate"),
    (["workload=azure_conv", "+workload.max_requests=5"],
     r"^workload.max_requests=5 is invalid with workload=trace: the first N rows it replays are workload.num_"),
    (["workload=uniform", "workload.qps=null"], r"^workload.qps=None is invalid with workload=uniform: null"),
    (["workload=uniform", "workload.num_requests=null"], r"^workload.num_requests=None is invalid with workload="),
    (["workload=uniform", "+workload.offset=3"], r"^workload.offset=3 is invalid with workload=uniform: it skips"),
    (["workload=azure_conv", "task=capacity", "workload.time_scale=0"],
     r"^workload.time_scale=0 is invalid with task=capacity: the search sets the rate"),
])
def test_bad_knobs_are_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(compose_config(overrides))


@pytest.mark.parametrize("overrides,message", [
    (["workload=azure_code", "workload.offset=8819"],
     r"^workload.offset=8819 is invalid: workload.path='sim/data/traces/azure_code.csv' has 8819 rows$"),
    (["workload=azure_conv", "workload.qps=1e-6"],
     r"^workload.qps=1e-06 is invalid: the 512 replayed rows of .* span 5.11e\+08 s at that rate, past the 86400"),
])
def test_rows_and_rates_a_trace_cannot_give_are_refused_before_the_run(overrides, message):
    with pytest.raises(ConfigError, match=message):
        preflight(parse_config(compose_config([*SIM, *overrides])))


def test_a_request_longer_than_the_context_is_refused_at_its_line_as_any_trace_s():
    trace = _recorded("azure_conv")
    longest = int((trace.num_prefill_tokens + trace.num_decode_tokens).idxmax())
    with pytest.raises(ConfigError, match=rf"^workload.path='sim/data/traces/azure_conv.csv' line {longest + 2}: a "
                                          r"request of 14089 tokens is invalid: more than the model's context of 8192"):
        preflight(parse_config(compose_config([*SIM, "workload=azure_conv", "workload.num_requests=null"])))


@pytest.mark.e2e
def test_the_command_line_refuses_a_bad_trace_knob_in_one_line_exit_2(tmp_path):
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "kernels")])}
    done = subprocess.run([sys.executable, "-m", "sarathi_lab.run", *SIM, "workload=azure_code", "workload.offset=9000",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in output and not list(tmp_path.rglob("metrics*.json"))
    # README's refusal: one `error:` line on stderr, naming the full key.
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: workload.offset=9000 is invalid: workload.path="), output


@pytest.mark.parametrize("name", TRACES)
def test_the_azure_capacity_searches_replay_the_trace_at_each_rate_on_the_calibrated_model(name):
    cfg = compose_config([f"experiment=capacity_sim_{name}"])
    run = parse_config(cfg)
    assert (run.task, run.workload.kind, run.workload.num_requests, run.workload.qps) == ("capacity", "trace", 2048,
                                                                                         None)
    assert run.workload.path == f"sim/data/traces/{name}.csv" and run.engine.sim_cost_model == "calibrated"
    assert run.engine.max_model_len == 8192 and run.key_values()["seq_len"] is None
    sweep = OmegaConf.load(CONF_DIR / "experiment" / "capacity_sim_azure_conv.yaml").hydra.sweeper.params
    assert (sweep.slo, sweep.scheduler) == ("strict,relaxed", "sarathi_serve,vllm")
    # Every request of the searched window fits the context: the preflight reads them all.
    assert preflight(run).workload.num_requests == 2048
