"""A sweep rerun into a finished sweep's directory that every job refuses (on_existing=refuse)
changes no byte of the finished sweep: its jobs and its sweep_summary.json ('0: ok, 1: ok' became
'0: failed, 1: failed'); the rerun's own report goes beside, in .sweep_summary.next.json."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _sweep(sweep_dir: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    return subprocess.run([sys.executable, "-m", "sarathi_lab.run", "-m", "chunk=32,64", "executor=sim", "logger=none",
                           "model=tiny", f"hydra.sweep.dir={sweep_dir}"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600, check=False)


def _digests(sweep_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(sweep_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(sweep_dir.rglob("*")) if p.is_file() and p.name != "multirun.yaml"
            and not any(part.startswith(".") and part.endswith(".next") for part in p.relative_to(sweep_dir).parts)
            and p.name not in (".sweep_summary.next.json", ".sweep_summary.next.csv")}


def test_a_refused_rerun_changes_no_byte_of_the_finished_sweep(tmp_path):
    sweep_dir = tmp_path / "sweep"
    first = _sweep(sweep_dir, tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    before = _digests(sweep_dir)
    jobs = json.loads((sweep_dir / "sweep_summary.json").read_text())
    assert [job.split("_")[0] for job in jobs] == ["0", "1"]
    assert list(jobs.values()) == [{"status": "ok", "error": None}] * 2
    again = _sweep(sweep_dir, tmp_path)
    assert again.returncode == 1, again.stderr[-2000:]
    assert _digests(sweep_dir) == before
    report = json.loads((sweep_dir / ".sweep_summary.next.json").read_text())
    assert (sweep_dir / ".sweep_summary.next.csv").is_file()  # the rerun's table went beside the finished one too
    assert {job: r["status"] for job, r in report.items()} == {job: "failed" for job in jobs}
    assert "on_existing=refuse" in next(iter(report.values()))["error"]
