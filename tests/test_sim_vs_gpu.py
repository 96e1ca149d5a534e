"""The comparison of measured serving runs with their simulated rebuilds, at CI size: tiny pd_ratio
runs measured on this CPU stand for the GPU's (their times are not under test, only that each run is
rebuilt from its own command line and batched as the real engine batched it)."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from sarathi_lab.bench import sim_vs_gpu


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    sim_vs_gpu._smoke_runs(root)
    return root


@pytest.fixture(scope="module")
def compared(measured, tmp_path_factory):
    work = tmp_path_factory.mktemp("work")
    table, points = sim_vs_gpu.compare(measured, work, "cpu", cost_models=("roofline",), progress=lambda _: None)
    return table, points, work


def test_every_measured_run_is_rebuilt_and_batched_as_the_real_engine_batched_it(measured, compared):
    table, points, work = compared
    assert len(table) == 4 and set(table.scheduler) == {"static", "sarathi"}
    assert table.identical_batches.all()
    assert (table.iterations_real == table.iterations_sim).all()
    # The rebuild ran on the simulator with the run's own keys, not the real engine again.
    for run in work.glob("roofline/pd_ratio/multiruns/smoke/*/metrics.json"):
        record = json.loads(run.read_text())
        assert record["environment"]["simulated"] and record["resolved_config"]["engine"]["sim_device"] == "cpu"
        original = json.loads((measured / run.relative_to(work / "roofline")).read_text())
        assert {k: record["config"][k] for k in ("scheduler", "pd_ratio", "chunk", "batch_size", "seq_len")} == {
            k: original["config"][k] for k in ("scheduler", "pd_ratio", "chunk", "batch_size", "seq_len")}
    for key in sim_vs_gpu.LATENCIES:
        assert table[f"{key}_rel_err"].notna().all() and (table[f"{key}_sim"] > 0).all()
    assert (points.measured_s > 0).all() and (points.simulated_s > 0).all()
    assert set(sim_vs_gpu.by_kind(points).kind) <= {"decode", "prefill", "hybrid"}


def test_the_gain_is_the_claims_gain_measured_and_simulated(measured, compared):
    _, _, work = compared
    gains, claim_rows = sim_vs_gpu.gains(measured, work, cost_models=("roofline",))
    # By hand from each run's own metrics.json: sarathi's total throughput over static's.
    throughput = {}
    for metrics in measured.glob("pd_ratio/multiruns/smoke/*/metrics.json"):
        record = json.loads(metrics.read_text())
        throughput[record["config"]["scheduler"], record["config"]["pd_ratio"]] = \
            record["summary"]["total_throughput_tok_s"]
    for row in gains.itertuples():
        assert row.measured == pytest.approx(throughput["sarathi", row.pd_ratio] / throughput["static", row.pd_ratio])
        assert row.roofline > 0
    assert sorted(gains.pd_ratio) == [4, 16]
    assert list(claim_rows.source.str.split(",").str[0].unique()) == ["measured CPU", "simulated CPU (roofline)"]


def test_a_stall_is_an_iteration_far_slower_than_its_kind():
    iterations = pd.DataFrame({"num_prefill_tokens": [0, 0, 0, 0, 32, 32, 32],
                               "num_decode_tokens": [2, 2, 2, 2, 0, 0, 0],
                               "duration_s": [0.01, 0.011, 0.3, 0.01, 0.05, 0.2, 0.05]})
    # 0.3 s is 30x the decodes' median; 0.2 s is 4x the prefills': slow, but not a stall.
    assert sim_vs_gpu.stalls(iterations).tolist() == [False, False, True, False, False, False, False]


def test_the_rebuild_keeps_the_runs_keys_and_sets_its_own(tmp_path):
    run = tmp_path / "job"
    run.mkdir()
    given = ["chunk=256", "executor=model", "logger=wandb", "on_existing=skip", "engine.sim_cost_model=profile",
             "hydra.sweep.dir=x", "device=cuda", "+seed=3", "~logger"]
    (run / "metrics.json").write_text(json.dumps({"summary": {}, "config": {}, "environment": {}, "resolved_config": {},
                                                  "overrides": given}))
    assert sim_vs_gpu.overrides_of(run) == ["chunk=256", "device=cuda", "+seed=3"]


def test_no_runs_root_or_one_without_serving_runs_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        sim_vs_gpu.main(["--out", str(tmp_path)])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == ("error: --runs is required (the measured runs' results root), "
                                               "unless --smoke")
    with pytest.raises(SystemExit) as e:
        sim_vs_gpu.main(["--runs", str(tmp_path), "--out", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --runs {tmp_path} is invalid: it holds no finished measured")


@pytest.mark.e2e
def test_smoke_writes_every_table_and_the_figure(tmp_path, monkeypatch):
    monkeypatch.setenv("SARATHI_PROFILES_DIR", str(tmp_path / "profiles"))  # where --smoke puts it, undone after
    sim_vs_gpu.main(["--smoke", "--out", str(tmp_path)])
    table = pd.read_csv(tmp_path / "validation_cpu.csv")
    assert sorted(table.cost_model.unique()) == sorted(sim_vs_gpu.COST_MODELS)
    assert table.identical_batches.all()
    summary = pd.read_csv(tmp_path / "validation_cpu_summary.csv")
    assert (summary.identical_batches == summary.runs).all()
    gains = pd.read_csv(tmp_path / "validation_cpu_gains.csv")
    assert set(sim_vs_gpu.COST_MODELS) <= set(gains.columns)
    for name in ("validation_cpu_iterations.csv", "validation_cpu_claims.csv", "validation_cpu.png"):
        assert (tmp_path / name).stat().st_size > 0
