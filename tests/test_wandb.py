"""W&B logging: an offline run read back from its files carries the config, history, summary and
grouping; and no W&B failure ever fails a run."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import wandb

from sarathi_lab.harness import CONF_DIR, REPO_ROOT
from sarathi_lab.harness.compose import run_in_process
from sarathi_lab.harness.results import load_runs
from sarathi_lab.harness.schema import LoggerCfg
from sarathi_lab.harness.wandb_logger import (
    FIGURE_PREFIX,
    HISTORY_PREFIX,
    SWEEP_JOB_TYPE,
    SWEEP_TABLE_KEY,
    TIME_AXIS,
    WandbName,
    WandbSession,
    resolve_mode,
)
from tests.wandb_records import inspect_summary, parse_records, read_offline_run

RUN = ["experiment=smoke", "workload.num_requests=2", "seq_len=48", "pd_ratio=5", "chunk=16", "tags=[paper]"]


@pytest.fixture(autouse=True)
def offline_and_isolated(monkeypatch, tmp_path):
    for var in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(var, raising=False)
    # Keep W&B's caches and staging files out of the home directory.
    for var in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))


@pytest.mark.e2e
def test_an_offline_run_holds_config_history_summary_and_grouping(tmp_path, capfd, caplog):
    out = tmp_path / "run"
    with caplog.at_level("INFO", logger="sarathi_lab.harness.wandb_logger"):
        assert run_in_process([*RUN, "logger.mode=offline"], out, group="smoke-sweep1") == "ok"
    assert "Symlinked" not in "".join(capfd.readouterr()), "W&B's per-file warnings are noise"
    # Where the offline run went and how to upload it: the folder wandb sync takes.
    (synced,) = [r.getMessage() for r in caplog.records if "wandb sync" in r.getMessage()]
    (folder,) = (out / "wandb").glob("offline-run-*")
    assert synced.endswith(f"upload it with: wandb sync {folder}")
    metrics = json.loads((out / "metrics.json").read_text())
    wb = read_offline_run(out / "wandb")

    assert wb.run.run_group == "smoke-sweep1" and wb.run.job_type == "smoke"
    assert wb.run.display_name == "tiny sarathi chunk=16 batch_size=4 workload.num_requests=2 seq_len=48 pd_ratio=5 " \
                                  "tags=[paper]"
    assert set(wb.run.tags) == {"paper", "smoke", "serve", "sarathi", "tiny"}
    assert wb.config["chunk"] == 16 and wb.config["workload"]["num_requests"] == 2
    assert wb.config["model"] == {"name": "tiny", "path": None}
    # What ran, which the requested config cannot say (device=auto, a bfloat16 that fell back to float32).
    for key in ("device", "dtype", "device_name", "git_commit"):
        assert wb.config["environment"][key] == metrics["environment"][key]

    iterations = pd.read_parquet(out / "iterations.parquet")
    rows = [row for row in wb.history if f"{HISTORY_PREFIX}duration_s" in row]
    assert [row["_step"] for row in rows] == iterations.iteration.tolist()
    # Each iteration at its own time on the engine's clock, not at W&B's _runtime of the logging.
    assert [row[TIME_AXIS] for row in rows] == pytest.approx((iterations.start_s + iterations.duration_s).tolist())
    assert all(b > a for a, b in zip([r[TIME_AXIS] for r in rows], [r[TIME_AXIS] for r in rows][1:]))
    assert rows[-1][TIME_AXIS] == pytest.approx(metrics["summary"]["makespan_s"])  # all arrived at 0
    axes = {m.name or m.glob_name: m.step_metric for m in wb.metrics}
    assert axes.get(f"{HISTORY_PREFIX}*") == TIME_AXIS, "W&B plots the history over the engine's clock"
    prefill = sum(row.get(f"{HISTORY_PREFIX}num_prefill_tokens", 0) for row in wb.history)
    assert prefill == metrics["summary"]["prefill_tokens"]
    for key in ("total_throughput_tok_s", "decode_throughput_tok_s", "ttft_p50_s", "itl_p99_s", "kv_tokens_read"):
        assert wb.summary[key] == pytest.approx(metrics["summary"][key])
    assert wb.summary["requests.nrows"] == 2, "the requests table"
    for key in ("timing_unreliable", "simulated", "git_commit", "sarathi_lab_version", "device_name"):
        assert wb.summary[f"env/{key}"] == metrics["environment"][key], "provenance beside the numbers"
    saved = {p.name for p in (out / "wandb").glob("offline-run-*/files/*")}
    assert {"metrics.json", "iterations.parquet", "requests.parquet"} <= saved, "the run's files, for the W&B API"
    assert len(load_runs(out)) == 1, "W&B's copy of metrics.json is not a second run"
    # As W&B itself reads the run: whole-run metrics only, none of the last iteration's values, and
    # _runtime the run's duration (opened as the run began), not the seconds the logging took.
    seen = inspect_summary(out / "wandb")
    assert seen["state"] == "finished"
    assert not [k for k in seen["summary"] if k.startswith(HISTORY_PREFIX)], "iterations stay in the history"
    assert seen["summary"]["mean_ttft_ms"] == pytest.approx(metrics["summary"]["mean_ttft_ms"])
    assert seen["summary"]["_runtime"] >= metrics["wall_time_s"]
    assert_a_torn_read_yields_the_records_written_so_far(next((out / "wandb").rglob("run-*.wandb")))


def assert_a_torn_read_yields_the_records_written_so_far(path):
    # W&B's service is still writing while the reader reads, so the file can end at any byte.
    data = path.read_bytes()
    whole = parse_records(data)
    for cut in [*range(0, len(data), 61), *range(len(data) - 64, len(data))]:
        got = parse_records(data[:cut])
        assert got == whole[:len(got)], f"a read cut at byte {cut} of {len(data)}"
    assert parse_records(data[:-1]) == whole[:-1]


@pytest.mark.parametrize("failure", [OSError("[Errno 13] Permission denied: '/results/wandb'"),
                                     wandb.errors.CommError("Network error (ConnectTimeout)\nretrying...")])
def test_a_wandb_failure_is_one_warning_and_the_run_still_succeeds(tmp_path, monkeypatch, caplog, failure):
    def broken_init(**kwargs):
        raise failure
    monkeypatch.setattr(wandb, "init", broken_init)
    with caplog.at_level(logging.WARNING):
        assert run_in_process(RUN, tmp_path) == "ok"
    assert (tmp_path / "metrics.json").exists()
    (warning,) = [r.getMessage() for r in caplog.records if "W&B" in r.getMessage()]
    assert "results in" in warning and "\n" not in warning


def test_logger_none_never_touches_wandb(tmp_path, monkeypatch):
    monkeypatch.setattr(wandb, "init", lambda **kw: pytest.fail("W&B was called with logger=none"))
    assert run_in_process([*RUN, "logger=none"], tmp_path) == "ok"
    assert not (tmp_path / "wandb").exists()


@pytest.mark.parametrize("env,mode,expected", [
    ({}, "auto", "offline"),
    ({"WANDB_API_KEY": "k"}, "auto", "online"),
    ({"WANDB_API_KEY": "k", "WANDB_MODE": "disabled"}, "auto", "disabled"),
    ({"WANDB_API_KEY": "k"}, "offline", "offline"),
    ({}, "online", "online"),
])
def test_mode_offline_unless_an_account_or_the_user_says_otherwise(monkeypatch, env, mode, expected):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert resolve_mode(LoggerCfg(kind="wandb", mode=mode)) == expected


@pytest.mark.e2e
def test_a_single_simulated_run_is_grouped_by_its_experiment_and_tagged_simulated(tmp_path):
    out = tmp_path / "run"
    assert run_in_process(["experiment=smoke", "executor=sim", "engine.num_kv_blocks=64", "workload.num_requests=2",
                           "logger.mode=offline"], out) == "ok"
    wb = read_offline_run(out / "wandb")
    assert wb.run.run_group == "smoke" and "simulated" in wb.run.tags
    assert wb.run.display_name == "tiny sarathi chunk=64 batch_size=4 executor=sim engine.num_kv_blocks=64 " \
                                  "workload.num_requests=2"
    assert wb.summary["env/simulated"] is True and wb.summary["env/device_name"].startswith("simulated H100")


def test_w_b_is_given_a_run_s_folder_whole(tmp_path, monkeypatch):
    # Its service may be another process's, in another working directory (WANDB_SERVICE): a sweep's
    # relative folder lost its .wandb file there.
    given = {}
    monkeypatch.setattr(wandb, "init", lambda **kwargs: given.update(kwargs))
    monkeypatch.chdir(tmp_path)
    WandbSession(LoggerCfg(kind="wandb", mode="offline"), WandbName(
        run_dir=Path("outputs/smoke/multiruns/x"), name="x", group=None, job_type="sweep", tags=[], config={}))
    assert given["dir"] == tmp_path / "outputs" / "smoke" / "multiruns" / "x"


@pytest.mark.e2e
def test_the_readme_compares_an_offline_sweep(tmp_path, monkeypatch):
    # sarathi_lab/conf/experiment/README.md, "Comparing runs offline": its sweep, then its Python block.
    readme = (CONF_DIR / "experiment" / "README.md").read_text()
    block = readme[readme.index("<!-- compare-offline"):].split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.setenv("WANDB_MODE", "offline")
    # A W&B service of this process, in another working directory, which the sweep's process takes
    # (WANDB_SERVICE), as one started from a notebook that used W&B does; an earlier test's in-process
    # run left one here now and then, and the sweep's own run lost its .wandb file.
    wandb.setup()
    assert os.environ.get("WANDB_SERVICE")
    proc = subprocess.run([sys.executable, "-m", "sarathi_lab.run", "-m", "experiment=smoke", "chunk=32,64",
                           "workload.num_requests=2", "seq_len=48", "pd_ratio=5"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, check=False, env=os.environ | {"PYTHONPATH": str(REPO_ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(list(tmp_path.glob("outputs/smoke/multiruns/*/*/wandb/offline-run-*"))) == 2, "what wandb sync uploads"
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(block, scope)  # noqa: S102 - the README's own example
    assert sorted(scope["runs"].chunk) == [32, 64] and scope["runs"].total_throughput_tok_s.gt(0).all()
    assert set(scope["iters"].chunk) == {32, 64} and "duration_s" in scope["iters"]

    # The sweep as one view in W&B, as W&B's own reader reads it: a run of the sweep's group holding its
    # table and figure beside its jobs' runs, whose summaries hold run metrics only.
    (sweep,) = tmp_path.glob("outputs/smoke/multiruns/*")
    report = inspect_summary(sweep / "wandb")
    jobs = [inspect_summary(d / "wandb") for d in sorted(sweep.glob("[0-9]*"))]
    assert report["state"] == "finished" and {j["state"] for j in jobs} == {"finished"}
    wb = read_offline_run(sweep / "wandb")
    assert wb.run.job_type == SWEEP_JOB_TYPE and {wb.run.run_group} == {read_offline_run(d / "wandb").run.run_group
                                                                       for d in sweep.glob("[0-9]*")}
    logged_table = report["summary"][SWEEP_TABLE_KEY]
    assert logged_table["_type"] == "table-file" and logged_table["nrows"] == 2
    assert report["summary"]["jobs"] == 2 and report["summary"]["jobs_ok"] == 2
    assert report["summary"][f"{FIGURE_PREFIX}sweep_summary"]["_type"] == "image-file"
    (files,) = (sweep / "wandb").glob("offline-run-*/files")
    assert (files / report["summary"][f"{FIGURE_PREFIX}sweep_summary"]["path"]).is_file()
    logged = json.loads((files / logged_table["path"]).read_text())
    csv = pd.read_csv(sweep / "sweep_summary.csv")
    assert logged["columns"] == list(csv.columns) and len(logged["data"]) == len(csv)
    for job in jobs:
        assert not [k for k in job["summary"] if k.startswith(HISTORY_PREFIX)], "no last-iteration values"
        assert {"ttft_p50_s", "p99_itl_ms", "total_throughput_tok_s"} <= set(job["summary"])
