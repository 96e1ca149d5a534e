"""W&B logging: an offline run read back from its files carries the config, history, summary and
grouping; and no W&B failure ever fails a run."""
from __future__ import annotations

import json
import logging

import pandas as pd
import pytest
import wandb

from sarathi_lab.harness.compose import run_in_process
from sarathi_lab.harness.results import load_runs
from sarathi_lab.harness.schema import LoggerCfg
from sarathi_lab.harness.wandb_logger import HISTORY_PREFIX, resolve_mode
from tests.wandb_records import read_offline_run

RUN = ["experiment=smoke", "workload.num_requests=2", "seq_len=48", "pd_ratio=5", "chunk=16", "tags=[paper]"]


@pytest.fixture(autouse=True)
def offline_and_isolated(monkeypatch, tmp_path):
    for var in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(var, raising=False)
    # Keep W&B's caches and staging files out of the home directory.
    for var in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))


@pytest.mark.e2e
def test_an_offline_run_holds_config_history_summary_and_grouping(tmp_path, capfd):
    out = tmp_path / "run"
    assert run_in_process([*RUN, "logger.mode=offline"], out, group="smoke-sweep1") == "ok"
    assert "Symlinked" not in "".join(capfd.readouterr()), "W&B's per-file warnings are noise"
    metrics = json.loads((out / "metrics.json").read_text())
    wb = read_offline_run(out / "wandb")

    assert wb.run.run_group == "smoke-sweep1" and wb.run.job_type == "smoke"
    assert set(wb.run.tags) == {"paper", "smoke", "serve", "sarathi", "tiny"}
    assert wb.config["chunk"] == 16 and wb.config["workload"]["num_requests"] == 2
    assert wb.config["model"] == {"name": "tiny", "path": None}
    # What ran, which the requested config cannot say (device=auto, a bfloat16 that fell back to float32).
    for key in ("device", "dtype", "device_name", "git_commit"):
        assert wb.config["environment"][key] == metrics["environment"][key]

    steps = [row["_step"] for row in wb.history if f"{HISTORY_PREFIX}duration_s" in row]
    assert steps == pd.read_parquet(out / "iterations.parquet").iteration.tolist()
    prefill = sum(row.get(f"{HISTORY_PREFIX}num_prefill_tokens", 0) for row in wb.history)
    assert prefill == metrics["summary"]["prefill_tokens"]
    for key in ("total_throughput_tok_s", "decode_throughput_tok_s", "ttft_p50_s", "itl_p99_s", "kv_tokens_read"):
        assert wb.summary[key] == pytest.approx(metrics["summary"][key])
    assert wb.summary["requests.nrows"] == 2, "the requests table"
    saved = {p.name for p in (out / "wandb").glob("offline-run-*/files/*")}
    assert {"metrics.json", "iterations.parquet", "requests.parquet"} <= saved, "the run's files, for the W&B API"
    assert len(load_runs(out)) == 1, "W&B's copy of metrics.json is not a second run"


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
