"""The comparison of measured GPU runs with their simulated rebuilds, at CI size: tiny runs of every run
kind the GPU suite measures (pd_ratio, orca_compare and chunk_batch serve; per_token_cost, decode_speedup,
chunk_overhead and tile_quantization time hand-built batches), measured on this CPU, stand for the
GPU's (their times are not under test, only that each run is rebuilt from its own recorded config, batched
or built as the real engine did, and every timed iteration paired with its prediction)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from sarathi_lab.config import ConfigError
from sarathi_lab.harness import CONF_DIR, cli_check, scales
from sarathi_lab.harness.compose import compose_config, run_in_process
from sarathi_lab.measure.bench import task_tables
from sarathi_lab.measure.sim_check import rebuild, sim_vs_gpu
from sarathi_lab.measure.sim_check import sim_vs_gpu_report as report
from sarathi_lab.sim.cost_model import CostModel

RUN_KINDS = {"pd_ratio", "orca_compare", "per_token_cost", "decode_speedup", "chunk_overhead", "tile_quantization",
             "chunk_batch"}
SERVING = {"pd_ratio", "orca_compare", "chunk_batch"}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    sim_vs_gpu._smoke_runs(root)
    return root


@pytest.fixture(scope="module")
def compared(measured, tmp_path_factory):
    work = tmp_path_factory.mktemp("work")
    # calibrated: the CPU's device file has no calibration, so the simulator refuses it there.
    result = sim_vs_gpu.compare(measured, work, "cpu", cost_models=("roofline", "calibrated"), progress=lambda _: None)
    return result, work


def test_every_run_kind_is_compared_and_rebuilt_as_the_real_engine_ran_it(measured, compared):
    (table, points, _), work = compared
    assert set(table.run_kind) == RUN_KINDS and len(table) == 10 and set(table.cost_model) == {"roofline"}
    assert table.identical_batches.all() and (table.iterations_real == table.iterations_sim).all()
    assert (table.points > 0).all()
    # The rebuild ran on the simulator with the run's own keys, not the real engine again.
    for run in work.glob("roofline/*/multiruns/smoke/*/metrics.json"):
        record = json.loads(run.read_text())
        assert record["environment"]["simulated"] and record["resolved_config"]["engine"]["sim_device"] == "cpu"
        original = json.loads((measured / run.relative_to(work / "roofline")).read_text())
        keys = ("task", "scheduler", "pd_ratio", "chunk", "batch_size", "seq_len")
        assert {k: record["config"][k] for k in keys} == {k: original["config"][k] for k in keys}
    serving = table[table.task == "serve"]
    assert set(serving.run_kind) == SERVING
    for key in sim_vs_gpu.LATENCIES:
        assert serving[f"{key}_rel_err"].notna().all() and (serving[f"{key}_sim"] > 0).all()
    assert (points.measured_s > 0).all() and (points.predicted_s > 0).all()
    kinds = set(points.kind)
    assert set(report.ITERATION_KINDS) <= kinds <= set(report.ITERATION_KINDS) | set(report.OTHER_KINDS)
    # Each measurement task's kinds, from its own table: piggyback's three iterations, op_breakdown's two.
    by_run = points.groupby("run_kind").kind.agg(set)
    assert by_run["decode_speedup"] == {"decode", "prefill", "hybrid"}
    assert by_run["per_token_cost"] == {"decode", "prefill"} and by_run["tile_quantization"] == {"prefill"}
    assert by_run["chunk_overhead"] == {"prefill", *report.OTHER_KINDS}


def test_a_cost_model_that_cannot_run_is_reported_once_per_run_kind(compared):
    (table, _, unavailable), _ = compared
    assert "calibrated" not in set(table.cost_model)
    assert sorted(unavailable.run_kind) == sorted(RUN_KINDS) and set(unavailable.cost_model) == {"calibrated"}
    assert unavailable.set_index("run_kind").runs.to_dict() == {k: 4 if k == "pd_ratio" else 1 for k in RUN_KINDS}
    assert unavailable.status.str.startswith("unavailable: sim_cost_model='calibrated' is invalid").all()
    errors = report.iteration_errors(compared[0].points, unavailable)
    refused = errors[errors.cost_model == "calibrated"]
    assert len(refused) == len(RUN_KINDS) and (refused.points == 0).all()


def test_a_measured_tasks_iterations_are_the_cost_models_prices_of_its_batches(measured, compared):
    """decode_speedup's simulated rows, by hand: task=piggyback's three batches priced by the cost model
    the rebuild used (forward seconds, as the real task times the forward)."""
    (_, points, _), _ = compared
    record = json.loads(next(measured.glob("decode_speedup/multiruns/smoke/*/metrics.json")).read_text())
    cfg = record["config"]
    cm = CostModel.for_device("cpu", "tiny", "roofline", "float32")
    measured_ms = pd.read_parquet(next(measured.glob("decode_speedup/multiruns/smoke/*/piggyback.parquet")))
    # The chunk that ran: the tile-aligned one where the run aligned it (scheduler.chunk_align=tile).
    chunk = int(measured_ms.set_index("iteration").tokens["chunk_alone"])
    b, context = cfg["batch_size"], cfg["seq_len"]
    by_hand = {"decode": cm.iteration_cost([], [context] * b).forward_s,
               "prefill": cm.iteration_cost([(chunk, chunk)], []).forward_s,
               "hybrid": cm.iteration_cost([(chunk, chunk)], [context] * (b - 1)).forward_s}
    ours = points[(points.run_kind == "decode_speedup") & (points.cost_model == "roofline")].set_index("kind")
    for kind, seconds in by_hand.items():
        assert ours.predicted_s[kind] == pytest.approx(seconds, rel=1e-9)
    assert sorted(ours.measured_s * 1e3) == pytest.approx(sorted(measured_ms.ms))


def test_tables_pair_row_by_row_and_say_when_the_rebuild_timed_other_rows():
    real = pd.DataFrame({"tokens": [8, 8, 16, 16], "op": ["total", "ffn", "total", "ffn"], "ms": [2.0, 1.0, 4.0, 2.0]})
    sim = real.assign(ms=real.ms * 1.5)
    both, same = task_tables.paired("iteration_sweep", real, sim)
    assert same and both.kind.eq("prefill").all() and list(both.label) == ["tokens=8", "tokens=16"]
    assert (both.simulated_s / both.measured_s).tolist() == pytest.approx([1.5, 1.5])
    _, same = task_tables.paired("iteration_sweep", real, sim[sim.tokens == 8])
    assert not same
    overhead = pd.DataFrame({"component": ["attention", "prefill", "end_to_end"], "whole_ms": [1.0, 10.0, 50.0],
                             "chunked_ms": [3.0, 12.0, 55.0], "slowdown": [3.0, 1.2, 1.1]})
    points = task_tables.TABLES["reread"].points(overhead).set_index(["component", "mode"])
    assert points.kind[("prefill", "whole")] == "prefill"  # one iteration: the whole prompt
    assert points.kind[("prefill", "chunked")] == task_tables.CHUNKS_SUMMED
    assert points.seconds[("end_to_end", "chunked")] == pytest.approx(0.055)


def test_errors_per_kind_leave_a_stall_out_and_pool_every_run_kind():
    # Job names repeat across sweeps (each sweep numbers its jobs from 0): a run is its run kind's job.
    points = pd.DataFrame({"run_kind": ["a", "a", "a", "b", "b"], "job": "0",
                           "cost_model": "roofline", "kind": ["decode", "decode", "decode", "decode", "hybrid"],
                           "measured_s": [1.0, 1.0, 50.0, 2.0, 4.0], "predicted_s": [1.1, 0.8, 1.0, 2.0, 2.0],
                           "stall": [False, False, True, False, False]})
    errors = report.iteration_errors(points, pd.DataFrame(columns=["run_kind", "cost_model", "runs", "status"]))
    a = errors[(errors.run_kind == "a")].iloc[0]
    assert a.points == 2 and a.stalls_left_out == 1
    assert a.median_abs_rel_err == pytest.approx(0.15) and a.worst_abs_rel_err == pytest.approx(0.2)
    pooled = errors[(errors.run_kind == report.ALL_RUNS)].set_index("kind")
    assert pooled.points["decode"] == 3 and pooled.worst_abs_rel_err["decode"] == pytest.approx(0.2)
    assert pooled.runs["decode"] == 2 and pooled.runs["hybrid"] == 1
    assert pooled.median_abs_rel_err["hybrid"] == pytest.approx(0.5)


def test_serving_errors_keep_the_worst_runs_sign():
    table = pd.DataFrame({"run_kind": "x", "task": "serve", "cost_model": "profile", "identical_batches": True,
                          "makespan_s_rel_err": [0.1, -0.3, 0.2], "itl_p99_s_rel_err": [0.0, 0.05, 0.5],
                          "ttft_p50_s_rel_err": [np.nan, 0.1, -0.1]})
    row = report.serving_errors(table).iloc[0]
    assert row.runs == 3 and row.makespan_s_median_rel_err == pytest.approx(0.1)
    assert row.makespan_s_worst_rel_err == pytest.approx(-0.3) and row.itl_p99_s_worst_rel_err == pytest.approx(0.5)


def test_the_gain_is_the_claims_gain_measured_and_simulated(measured, compared):
    _, work = compared
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


def _recorded(run_dir, resolved, overrides=()):
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.json").write_text(json.dumps({
        "summary": {}, "config": {}, "environment": {}, "resolved_config": resolved, "overrides": list(overrides)}))
    return run_dir


def test_the_rebuild_keeps_the_runs_keys_and_sets_its_own(tmp_path):
    given = ["chunk=256", "executor=model", "logger=wandb", "on_existing=skip", "engine.sim_cost_model=profile",
             "hydra.sweep.dir=x", "device=cuda", "+seed=3", "~logger", "measure.chunk_align=tile"]
    run = _recorded(tmp_path / "job", {}, given)
    # A decode_speedup run recorded before its alignment was the scheduler's key is rebuilt under that key.
    assert rebuild.overrides_of(run) == ["chunk=256", "device=cuda", "+seed=3", "scheduler.chunk_align=tile"]


def _resolved(*overrides) -> dict:
    return OmegaConf.to_container(compose_config(["model=tiny", *overrides]), resolve=True)


def test_a_recorded_key_renamed_since_is_rebuilt_under_todays_name(tmp_path):
    def rebuilt(name, scheduler, **measure):
        resolved = _resolved(f"scheduler={scheduler}")
        resolved["scheduler"].pop("chunk_align", None)  # as recorded before the key was the scheduler's
        resolved["measure"] |= measure
        return OmegaConf.select(rebuild.recorded_config(_recorded(tmp_path / name, resolved)), "scheduler")

    assert rebuilt("moved", "sarathi", chunk_align="tile").chunk_align == "tile"
    # Recorded before any chunk_align: sarathi aligned nothing then, whatever today's default.
    assert rebuilt("before", "sarathi").chunk_align == "none"
    # A scheduler without the knob ran without it.
    assert "chunk_align" not in rebuilt("orca", "orca", chunk_align="none")


def test_a_recorded_key_gone_since_or_a_value_no_longer_allowed_is_refused_in_one_line(tmp_path):
    gone = _resolved()
    gone["engine"]["spill_to_disk"] = True
    run = _recorded(tmp_path / "gone", gone)
    with pytest.raises(ConfigError) as e:
        rebuild.recorded_config(run)
    assert str(e.value).startswith(f"{run} cannot be rebuilt from its recorded config: engine.spill_to_disk=True "
                                   "is invalid") and "\n" not in str(e.value)
    refused = _resolved()
    refused["engine"]["attention"] = "flash_v0"
    run = _recorded(tmp_path / "refused", refused)
    with pytest.raises(ConfigError, match=f"^{run} cannot be rebuilt .*engine.attention='flash_v0' is invalid"):
        rebuild.recorded_config(run)


@pytest.mark.e2e
def test_a_run_is_rebuilt_as_it_ran_whatever_its_experiment_says_today(tmp_path, monkeypatch):
    """A default changed since the run (here orca_compare's KV cache, set to hold one request) changes
    neither the rebuilt config nor its batches: the rebuild runs the config the run recorded."""
    runs, command = tmp_path / "runs", ["experiment=orca_compare", *scales.overrides("orca_compare", "dry")]
    job = runs / "orca_compare" / "multiruns" / "t" / "0_tiny"
    run_in_process(command, job)
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    experiment = conf / "experiment" / "orca_compare.yaml"
    experiment.write_text(experiment.read_text().replace("engine:\n", "engine:\n  num_kv_blocks: 4\n", 1))
    monkeypatch.setattr(cli_check, "CONF_DIR", conf)
    assert compose_config(command).engine.num_kv_blocks == 4  # today's experiment differs
    table = sim_vs_gpu.compare(runs, tmp_path / "work", "cpu", cost_models=("roofline",),
                               progress=lambda _: None).table
    assert len(table) == 1 and table.identical_batches.all()
    def kept(resolved):  # less what the rebuild sets itself
        engine = {k: v for k, v in resolved["engine"].items() if k != "executor" and not k.startswith("sim_")}
        return {k: v for k, v in resolved.items() if k not in ("logger", "on_existing")} | {"engine": engine}

    ran = json.loads((job / "metrics.json").read_text())["resolved_config"]
    rebuilt = json.loads((tmp_path / "work" / "roofline" / job.relative_to(runs) / "metrics.json").read_text())
    assert rebuilt["resolved_config"]["engine"]["executor"] == "sim"
    assert kept(rebuilt["resolved_config"]) == kept(ran)


def test_no_runs_root_one_without_comparable_runs_or_no_lease_is_refused(tmp_path, measured, capsys):
    def refused(argv) -> str:
        with pytest.raises(SystemExit) as e:
            sim_vs_gpu.main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1
        return err[0]

    assert refused(["--out", str(tmp_path)]) == ("error: --runs is required (the measured runs' results root), "
                                                 "unless --smoke")
    assert refused(["--runs", str(tmp_path), "--out", str(tmp_path)]).startswith(
        f"error: --runs {tmp_path} is invalid: it holds no finished measured run with a comparison")
    assert refused(["--runs", str(measured)]).startswith("error: --lease is required unless --out")
    assert refused(["--runs", str(measured), "--lease", "9e2ae41"]).startswith("error: --lease '9e2ae41' is invalid")
    assert "'roofline,exact' is invalid: must be a comma list of roofline, profile, calibrated" in refused(
        ["--runs", str(measured), "--out", str(tmp_path), "--cost-model", "roofline,exact"])


def test_a_run_that_cannot_be_rebuilt_is_refused_in_one_line_before_any_is_simulated(tmp_path, measured, capsys):
    source = next(measured.glob("pd_ratio/multiruns/smoke/*/metrics.json")).parent
    runs = tmp_path / "runs"
    run = shutil.copytree(source, runs / "pd_ratio" / "multiruns" / "smoke" / source.name)
    record = json.loads((run / "metrics.json").read_text())
    record["resolved_config"]["workload"]["burst"] = 3  # a key this code does not know
    (run / "metrics.json").write_text(json.dumps(record))
    with pytest.raises(SystemExit) as e:
        sim_vs_gpu.main(["--runs", str(runs), "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"),
                         "--cost-model", "roofline"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {run} cannot be rebuilt from its recorded config: "
                                               "workload.burst=3 is invalid")
    assert not (tmp_path / "work").exists()


@pytest.mark.e2e
def test_smoke_writes_every_table_and_the_figure(tmp_path, monkeypatch):
    monkeypatch.setenv("SARATHI_PROFILES_DIR", str(tmp_path / "profiles"))  # where --smoke puts it, undone after
    sim_vs_gpu.main(["--smoke", "--out", str(tmp_path)])
    table = pd.read_csv(tmp_path / "runs.csv")
    assert sorted(table.cost_model.unique()) == ["profile", "roofline"] and set(table.run_kind) == RUN_KINDS
    assert table.identical_batches.all()
    errors = pd.read_csv(tmp_path / "iteration_errors.csv")
    refused = errors[errors.cost_model == "calibrated"]
    assert set(refused.run_kind) == RUN_KINDS and refused.status.str.startswith("unavailable").all()
    assert {"decode", "prefill", "hybrid"} <= set(errors[errors.run_kind == report.ALL_RUNS].kind)
    serving = pd.read_csv(tmp_path / "serving_errors.csv")
    assert set(serving.run_kind) == SERVING and (serving.identical_batches == serving.runs).all()
    gains = pd.read_csv(tmp_path / "gains.csv")
    assert {"roofline", "profile"} <= set(gains.columns)
    for name in ("claims.csv", "errors.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert (tmp_path / "work" / "points.csv").is_file()
