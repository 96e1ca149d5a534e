"""A sweep rerun into a finished sweep's directory changes no byte of the finished sweep: neither its
jobs nor its sweep_summary.json ('0: ok, 1: ok' once became '0: failed, 1: failed'); the rerun's own
report goes beside, in .sweep_summary.next.json. Under the default on_existing the rerun keeps each
job that ran its config (that is how an interrupted sweep resumes: tests/test_incomplete_sweeps.py)
and refuses one whose finished run is of another config."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _sweep(sweep_dir: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    return subprocess.run([sys.executable, "-m", "sarathi_lab.run", "-m", "chunk=32,64", "executor=sim", "logger=none",
                           "model=tiny", f"hydra.sweep.dir={sweep_dir}", *extra], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600, check=False)


def _digests(sweep_dir: Path) -> dict[str, str]:
    # Hydra's multirun.yaml and the sweep's lock (harness/sweep_state.py) record the latest launch.
    return {str(p.relative_to(sweep_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(sweep_dir.rglob("*")) if p.is_file() and p.name not in ("multirun.yaml", ".sweep.lock")
            and not any(part.startswith(".") and part.endswith(".next") for part in p.relative_to(sweep_dir).parts)
            and p.name not in (".sweep_summary.next.json", ".sweep_summary.next.csv")}


@pytest.mark.parametrize("rerun, code, status", [
    # The same sweep again: every job kept, nothing to do.
    ((), 0, "skipped"),
    # Another config in the same job folders (experiment= is left out of their names): refused.
    (("experiment=smoke",), 1, "failed"),
])
def test_a_rerun_changes_no_byte_of_the_finished_sweep(tmp_path, rerun, code, status):
    sweep_dir = tmp_path / "sweep"
    first = _sweep(sweep_dir, tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    before = _digests(sweep_dir)
    jobs = json.loads((sweep_dir / "sweep_summary.json").read_text())
    assert [job.split("_")[0] for job in jobs] == ["0", "1"]
    assert list(jobs.values()) == [{"status": "ok", "error": None}] * 2
    again = _sweep(sweep_dir, tmp_path, *rerun)
    assert again.returncode == code, again.stderr[-2000:]
    assert _digests(sweep_dir) == before
    report = json.loads((sweep_dir / ".sweep_summary.next.json").read_text())
    assert (sweep_dir / ".sweep_summary.next.csv").is_file()  # the rerun's table went beside the finished one too
    assert {job: r["status"] for job, r in report.items()} == {job: status for job in jobs}
    if status == "failed":
        error = next(iter(report.values()))["error"]
        assert error.startswith("on_existing=refuse: ") and "holds a finished run of another config (" in error
