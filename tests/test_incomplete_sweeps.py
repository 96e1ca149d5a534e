"""Real sweeps (pd_ratio at the CI scale, simulated), one of them interrupted by a real SIGINT after 2
of its 4 jobs: the claims and figures judge an experiment on its newest complete sweep and say which
newer incomplete one they passed over (it used to stand in for the experiment silently), judge an
incomplete sweep only when no complete one exists or when asked, and then say "incomplete: 2 of 4";
rerun into its directory under the default on_existing, the interrupted sweep resumes: its finished
jobs are kept byte for byte and the others run."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sarathi_lab.analysis import claims
from sarathi_lab.analysis.runs import INCLUDE_INCOMPLETE_ENV, Results

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ["-m", "experiment=ci/pd_ratio", "executor=sim"]
STOP_AT_JOB_2 = ["+hydra.callbacks.stop._target_=tests.sweep_callbacks.InterruptAtJob", "+hydra.callbacks.stop.job=2"]

pytestmark = pytest.mark.e2e


def _sweep(sweep_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))  # tests.sweep_callbacks
    return subprocess.run([sys.executable, "-m", "sarathi_lab.run", *SWEEP, f"hydra.sweep.dir={sweep_dir}", *extra],
                          cwd=sweep_dir.parents[2], env=env, capture_output=True, text=True, timeout=600, check=False)


def _digests(job: Path) -> dict[str, str]:
    return {str(p.relative_to(job)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(job.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("outputs")
    older, newer = (root / "pd_ratio" / "multiruns" / name for name in ("2026-01-01_00-00-00", "2026-01-02_00-00-00"))
    for sweep in (older, newer):
        sweep.mkdir(parents=True)
    done = _sweep(older)
    assert done.returncode == 0, done.stderr[-3000:]
    stopped = _sweep(newer, *STOP_AT_JOB_2)
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and "interrupted (SIGINT)" in stopped.stderr
    return {"root": root, "older": older, "newer": newer}


def _left_out(results: Results) -> str:
    rows = claims.claims_table(results, only=("pd_ratio",)).to_dict("records")
    assert len({row["left out"] for row in rows}) == 1
    return rows[0]["left out"]


def test_the_interrupted_sweep_is_passed_over_for_the_complete_one_and_the_claims_say_so(outputs):
    results = Results(outputs["root"], include_incomplete=False)
    assert results.sweep("pd_ratio") == outputs["older"]
    assert len(results.summary("pd_ratio")) == 4
    note = ("newer incomplete sweep 2026-01-02_00-00-00 skipped (2 of 4 jobs finished; the sweep did not end "
            "(still running, or its launcher was stopped); include_incomplete judges it)")
    assert results.sweep_note("pd_ratio") == note
    assert _left_out(results) == note
    assert note in results.describe("pd_ratio")  # the figures' titles


def test_asked_for_or_alone_the_incomplete_sweep_is_judged_and_marked(outputs, tmp_path, monkeypatch):
    kept = Results(outputs["root"], include_incomplete=True)
    assert kept.sweep("pd_ratio") == outputs["newer"] and len(kept.summary("pd_ratio")) == 2
    assert _left_out(kept).startswith("incomplete: 2 of 4 jobs finished; the sweep did not end")
    monkeypatch.setenv(INCLUDE_INCOMPLETE_ENV, "1")
    assert Results(outputs["root"]).sweep("pd_ratio") == outputs["newer"]
    monkeypatch.delenv(INCLUDE_INCOMPLETE_ENV)
    alone = tmp_path / "pd_ratio" / "multiruns" / outputs["newer"].name
    shutil.copytree(outputs["newer"], alone)
    results = Results(tmp_path)
    assert results.sweep("pd_ratio") == alone
    assert _left_out(results).startswith("incomplete: 2 of 4 jobs finished")
    assert "incomplete: 2 of 4 jobs finished" in results.describe("pd_ratio")


def test_rerun_under_the_default_on_existing_the_interrupted_sweep_resumes(outputs):
    newer = outputs["newer"]
    finished = {job: _digests(job) for job in newer.iterdir() if (job / "metrics.json").exists()}
    assert len(finished) == 2
    resumed = _sweep(newer)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert {job: _digests(job) for job in finished} == finished, "a finished job was run again"
    summary = json.loads((newer / "sweep_summary.json").read_text())
    assert sorted(s["status"] for s in summary.values()) == ["ok", "ok", "skipped", "skipped"]
    assert {newer / job for job, s in summary.items() if s["status"] == "skipped"} == set(finished)
    results = Results(outputs["root"])
    assert results.sweep("pd_ratio") == newer and results.sweep_note("pd_ratio") == ""
    assert _left_out(results) == "none"
    # Rerun once more, the complete sweep keeps every job and changes no byte of it or of its report.
    before = {job: _digests(job) for job in newer.iterdir() if job.is_dir() and not job.name.startswith(".")}
    report = (newer / "sweep_summary.json").read_bytes()
    again = _sweep(newer)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {job: _digests(job) for job in before} == before
    assert (newer / "sweep_summary.json").read_bytes() == report
