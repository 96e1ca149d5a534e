"""task=capacity through the CLI users start (a fresh interpreter), token_budget=auto, and the SLO
config of serving runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from sarathi_lab.config import ConfigError, EngineConfig
from sarathi_lab.harness.budget import MAX_BUDGET, auto_budget, fullest_iteration_s, largest_budget

ROOT = Path(__file__).resolve().parents[1]
SIM = ["executor=sim", "model=tiny", "logger=none"]


def _cli(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "kernels")])}
    return subprocess.run([sys.executable, "-m", "sarathi_lab.run", *SIM, *overrides, f"hydra.run.dir={tmp_path}"],
                          check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def _single_request_service_s() -> float:
    """How long one request of the test's shape takes alone on the simulator: with one request per
    iteration and (nearly) evenly spaced arrivals, the queue stays empty below 1 / this rate and
    grows from the first request above it, so the capacity is 1 / this by construction."""
    from sarathi_lab import LLM, SamplingParams

    llm = LLM("tiny", executor="sim", scheduler="sarathi", max_batch_size=1, chunk_size=512)
    llm.generate([[1] * 32], max_new_tokens=8, sampling=SamplingParams(ignore_eos=True))
    return llm.metrics.summary()["makespan_s"]


@pytest.mark.e2e
def test_capacity_search_finds_the_capacity_known_by_construction(tmp_path):
    resolution = 0.05
    done = _cli(tmp_path, "task=capacity", "batch_size=1", "seq_len=40", "pd_ratio=4", "workload.num_requests=20",
                "workload.arrival=gamma", "workload.cv=0.001", "slo.sched_delay_p50_s=0.0001",
                f"capacity.resolution={resolution}", "capacity.start_qps=10")
    assert done.returncode == 0, done.stderr[-2000:]
    expected = 1 / _single_request_service_s()
    found = json.loads((tmp_path / "capacity.json").read_text())
    failing = min(t["rate_rps"] for t in found["trials"] if not t["passed"])
    assert found["bounded"] and found["binding"] == "sched_delay_p50_s"
    assert found["capacity_rps"] <= expected * 1.01 and failing >= expected * 0.99
    assert failing <= found["capacity_rps"] * (1 + resolution)
    # The contract: every trial a finished run under the search's directory; the search's own metrics.json.
    for k, trial in enumerate(found["trials"]):
        run = tmp_path / trial["run_dir"]
        assert trial["run_dir"].startswith(f"trial-{k}-qps")
        assert {"metrics.json", "iterations.parquet", "requests.parquet"} <= {p.name for p in run.iterdir()}
        record = json.loads((run / "metrics.json").read_text())
        assert record["config"]["trial"] == k and record["config"]["qps"] == trial["rate_rps"]
        assert record["summary"]["passed"] == float(trial["passed"]) and "goodput_rps" in record["summary"]
    summary = json.loads((tmp_path / "metrics.json").read_text())["summary"]
    assert summary["capacity_rps"] == found["capacity_rps"] and summary["num_trials"] == len(found["trials"])
    assert len(pd.read_parquet(tmp_path / "trials.parquet")) == len(found["trials"])


@pytest.mark.e2e
def test_a_trial_serves_its_arrival_window_and_the_capacity_stays_the_same(tmp_path):
    """capacity.trial_s: each trial serves max(min_requests, qps * trial_s) of the pool's requests
    (a prefix of one arrival pattern); the D/D/1 case's capacity does not depend on how many."""
    done = _cli(tmp_path, "task=capacity", "batch_size=1", "seq_len=40", "pd_ratio=4", "workload.num_requests=60",
                "workload.arrival=gamma", "workload.cv=0.001", "slo.sched_delay_p50_s=0.0001",
                "capacity.resolution=0.05", "capacity.start_qps=10", "capacity.trial_s=0.1",
                "capacity.min_requests=15")
    assert done.returncode == 0, done.stderr[-2000:]
    trials = pd.read_parquet(tmp_path / "trials.parquet")
    expected = [min(60, max(15, -(-q * 0.1 // 1))) for q in trials.rate_rps]
    assert trials.requests.tolist() == expected and len(set(expected)) > 1
    for _, t in trials.iterrows():
        served = len(pd.read_parquet(tmp_path / t.run_dir / "requests.parquet"))
        # A trial stopped early records the requests that had arrived by then.
        assert served == t.requests if not t.stopped_early else 0 < served <= t.requests
        # Its metrics.json says it stopped early, and counts every request it did not finish, arrived or not.
        summary = json.loads((tmp_path / t.run_dir / "metrics.json").read_text())["summary"]
        assert summary["stopped_early"] == float(t.stopped_early)
        assert summary["num_unfinished"] == t.num_unfinished == t.requests - summary["num_requests"]
    found = json.loads((tmp_path / "capacity.json").read_text())
    capacity = 1 / _single_request_service_s()
    assert (found["capacity_rps"] <= capacity * 1.01
            <= min(t["rate_rps"] for t in found["trials"] if not t["passed"]) * 1.02)


def test_an_interrupted_search_saves_its_trials_and_the_interrupted_trial_as_partial_records(tmp_path, monkeypatch):
    from sarathi_lab.engine.slo_guard import SLOGuard
    from sarathi_lab.harness.compose import run_in_process
    from sarathi_lab.harness.interrupts import Interrupted

    calls, real_call = [], SLOGuard.__call__

    def sigterm_in_the_second_trial(self, record):
        calls.append(self)
        if len({id(g) for g in calls}) == 2 and record.iteration == 5:
            raise Interrupted(15)
        real_call(self, record)
    monkeypatch.setattr(SLOGuard, "__call__", sigterm_in_the_second_trial)
    with pytest.raises(Interrupted):
        run_in_process([*SIM, "task=capacity", "batch_size=1", "seq_len=40", "pd_ratio=4", "workload.num_requests=20",
                        "workload.arrival=gamma", "workload.cv=0.001", "slo.sched_delay_p50_s=0.0001",
                        "capacity.start_qps=10"], tmp_path)
    assert not (tmp_path / "metrics.json").exists() and not (tmp_path / "capacity.json").exists()
    assert json.loads((tmp_path / "metrics.partial.json").read_text())["summary"]["num_trials"] == 1
    assert pd.read_parquet(tmp_path / "trials.partial.parquet").run_dir.tolist() == ["trial-0-qps10"]
    assert (tmp_path / "trial-0-qps10" / "metrics.json").exists()
    record = json.loads((tmp_path / "trial-1-qps20" / "metrics.partial.json").read_text())
    assert record["partial"] and record["summary"]["num_iterations"] == 6 and record["config"]["trial"] == 1
    assert len(pd.read_parquet(tmp_path / "trial-1-qps20" / "iterations.partial.parquet")) == 6


@pytest.mark.e2e
def test_a_serving_run_reports_goodput_its_auto_budget_and_that_it_never_drained(tmp_path):
    done = _cli(tmp_path, "scheduler=sarathi_serve", "token_budget=auto", "slo.tbt_p99_s=0.002", "slo.ttft_s=0.01",
                "workload=uniform", "workload.num_requests=40", "workload.arrival=poisson", "workload.qps=2000",
                "seq_len=64", "pd_ratio=4", "workload.min_tokens=16")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "metrics.json").read_text())["summary"]
    assert summary["token_budget"] > 4 and summary["token_budget_predicted_s"] <= 0.002
    assert 0 <= summary["slo_attainment"] <= 1 and summary["goodput_rps"] >= 0
    assert summary["saturated"] == 1.0
    assert "never drained" in done.stdout + done.stderr


def test_largest_budget_against_a_hand_computed_linear_cost():
    # 1 ms fixed + 10 us per token: within 5 ms, (5 - 1) / 0.01 = 400 tokens.
    assert largest_budget(lambda b: 1e-3 + 1e-5 * b, 5e-3 + 1e-12, batch_size=8) == 400
    assert largest_budget(lambda b: 1e-3 + 1e-5 * b, 1e-3, batch_size=8) is None
    assert largest_budget(lambda b: 0.0, 1.0, batch_size=8) == MAX_BUDGET


@pytest.mark.parametrize("slo", [0.1, 0.5])
def test_auto_budget_is_the_last_budget_the_roofline_fits_within_the_slo(slo):
    from sarathi_lab.sim import CostModel

    engine = EngineConfig(model="mistral-7b", scheduler="sarathi_serve", executor="sim", sim_device="a100",
                          max_batch_size=32)
    tuned, budget = auto_budget(engine, slo, context=2048)
    roofline = CostModel.for_device("a100", "mistral-7b")
    assert tuned.chunk_size == budget.tokens and budget.cost_model == "roofline a100"
    assert fullest_iteration_s(roofline, budget.tokens, 32, 2048) <= slo < fullest_iteration_s(
        roofline, budget.tokens + 1, 32, 2048)


def test_auto_budget_refuses_an_slo_no_budget_meets():
    engine = EngineConfig(model="mistral-7b", scheduler="sarathi_serve", executor="sim", sim_device="a100")
    with pytest.raises(ConfigError, match=r"^slo.tbt_p99_s=0.0001 is invalid with token_budget=auto: the roofline"):
        auto_budget(engine, 1e-4, context=2048)


@pytest.mark.parametrize("overrides,message", [
    (["token_budget=auto", "scheduler=sarathi_serve"], "token_budget=auto is invalid with slo.tbt_p99_s=None"),
    (["slo.tbt_p99_s=nan"], "slo.tbt_p99_s=nan is invalid: must be a finite number"),
    (["slo.sched_delay_p50_s=-1"], "slo.sched_delay_p50_s=-1 is invalid: must be > 0"),
    (["task=capacity"], "workload.arrival=all_at_once is invalid with task=capacity"),
    (["task=capacity", "workload=trace", "workload.time_scale=0"],
     ("workload.time_scale=0 is invalid with task=capacity: the search sets the rate, so it needs arrival=poisson "
      r"or gamma, or a trace replayed at a rate \(workload=trace with time_scale > 0: its gaps scaled to each rate "
      r"tried\)$")),
    (["task=capacity", "workload.arrival=poisson", "slo.sched_delay_p50_s=null"],
     "slo.tbt_p99_s=None is invalid with task=capacity"),
    (["capacity.resolution=inf"], "capacity.resolution=inf is invalid: must be a finite number"),
    (["capacity.trial_s=nan"], "capacity.trial_s=nan is invalid: must be a finite number"),
    (["capacity.trial_s=0"], "capacity.trial_s=0 is invalid: must be > 0"),
])
def test_slo_and_capacity_settings_are_refused_in_one_line(overrides, message):
    from hydra import compose, initialize_config_dir

    from sarathi_lab.harness import CONF_DIR
    from sarathi_lab.harness.schema import parse_config

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[*SIM, *overrides])
    with pytest.raises(ConfigError, match=rf"^{message}"):
        parse_config(cfg)


@pytest.mark.parametrize("stages", [1, 2])
def test_auto_budget_under_pipeline_stages_says_the_slo_s_largest_may_not_hold_the_most(stages, caplog):
    from sarathi_lab.harness.cli_check import compose_config
    from sarathi_lab.harness.preflight import preflight
    from sarathi_lab.harness.schema import parse_config

    cfg = parse_config(compose_config(["experiment=capacity_sim_falcon180b_tp4pp2", "slo=llama70b_strict",
                                       "scheduler=sarathi_serve", f"engine.sim_pp={stages}",
                                       f"engine.sim_tp={8 // stages}"]))
    with caplog.at_level("WARNING", logger="sarathi_lab.harness.preflight"):
        checked = preflight(cfg)
    assert checked.budget["token_budget"] > cfg.engine.max_batch_size
    warned = [r.getMessage() for r in caplog.records if "pipeline stages" in r.getMessage()]
    said = ("token_budget=auto under 2 pipeline stages: the largest budget within the SLO is not always the one "
            "that holds the most; sweep token_budget=null chunk=... to find it (docs/parallel.md)")
    assert warned == ([] if stages == 1 else [said])
