"""Sweeps through a real process-based launcher, failure isolation and the end-of-sweep summary,
and a run stopped by SIGTERM."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sarathi_lab.harness.results import load_runs, write_status
from sarathi_lab.harness.sweep import summarize_sweep

TINY = ["experiment=smoke", "logger=none", "workload.num_requests=2", "seq_len=48", "pd_ratio=5"]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "sarathi_lab.run", *args]


@pytest.mark.e2e
def test_submitit_sweep_runs_jobs_as_processes_and_isolates_a_failing_one(tmp_path):
    sweep = tmp_path / "sweep"
    proc = subprocess.run(_cli("-m", *TINY, "chunk=0,16", "hydra/launcher=submitit_local",
                               "hydra.launcher.timeout_min=5", f"hydra.sweep.dir={sweep}"),
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert list(sweep.glob(".submitit/*/*_submitted.pkl")), "jobs did not go through submitit"
    failed = json.loads((sweep / "0" / "status.json").read_text())
    assert failed["status"] == "failed" and failed["error"] == "chunk=0 is invalid: must be > 0"
    assert not (sweep / "0" / "metrics.json").exists()
    assert json.loads((sweep / "1" / "status.json").read_text())["status"] == "ok"
    assert load_runs(sweep).chunk.tolist() == [16]
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert summary == {"0": {"status": "failed", "error": "chunk=0 is invalid: must be > 0"},
                       "1": {"status": "ok", "error": None}}
    assert "FAILED 0 (failed): chunk=0 is invalid" in proc.stdout + proc.stderr


def test_summary_tells_killed_jobs_and_ignores_earlier_sweeps(tmp_path):
    def job(name: str, status: str | None, age_s: float = 0.0) -> None:
        (tmp_path / name / ".hydra").mkdir(parents=True)
        (tmp_path / name / ".hydra" / "config.yaml").touch()
        if status:
            write_status(tmp_path / name, status, error="boom" if status == "failed" else None)
        if age_s:
            old = time.time() - age_s
            os.utime(tmp_path / name / ".hydra" / "config.yaml", (old, old))

    since = time.time() - 5
    job("0", "ok"), job("1", "failed"), job("2", "running"), job("3", None), job("4", "ok", age_s=3600)
    summary = summarize_sweep(tmp_path, since)
    assert {k: v["status"] for k, v in summary.items()} == {"0": "ok", "1": "failed", "2": "killed", "3": "unknown"}
    assert summary["1"]["error"] == "boom" and "killed" in summary["2"]["error"]


@pytest.mark.e2e
def test_sigterm_saves_partial_records_and_exits_with_the_signal(tmp_path):
    out = tmp_path / "run"
    # Long enough (minutes) that the signal lands mid-generate.
    proc = subprocess.Popen(_cli("experiment=smoke", "logger=none", "workload.num_requests=64", "seq_len=1024",
                                 "pd_ratio=1", f"hydra.run.dir={out}"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(lambda: _status(out) == "running", timeout_s=90)
        time.sleep(4)  # model built and warmed up (well under a second for tiny), some iterations done
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        output, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert time.monotonic() - sent < 10
    assert proc.returncode == 128 + signal.SIGTERM, output[-2000:]
    assert _status(out) == "interrupted"
    assert not (out / "metrics.json").exists()
    record = json.loads((out / "metrics.partial.json").read_text())
    assert record["partial"] is True and record["summary"]["num_iterations"] > 0
    assert (out / "iterations.partial.parquet").exists() and (out / "requests.partial.parquet").exists()


def _status(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / "status.json").read_text())["status"]
    except (OSError, ValueError):
        return None


def _wait_for(condition, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)
