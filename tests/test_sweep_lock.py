"""Two real sweeps into one directory: while one is alive, the other is refused in one line naming
the holder, exit 2, before it changes anything (both used to write sweep_summary.json, and each
reported the other's running job as killed); once the holder is killed (SIGKILL: no chance to
release anything), its lock does not block the next sweep, which resumes it."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sarathi_lab.harness.sweep_state import SWEEP_LOCK, SweepDirInUse, hold, sweep_state

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ["-m", "experiment=smoke", "executor=sim", "logger=none", "chunk=16,32"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))  # tests.sweep_callbacks
    return env


def _cli(sweep_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sarathi_lab.run", *SWEEP, f"hydra.sweep.dir={sweep_dir}", *extra]


def _digests(sweep_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(sweep_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(sweep_dir.rglob("*")) if p.is_file()}


@pytest.mark.e2e
def test_a_second_sweep_into_a_live_sweeps_directory_is_refused_and_a_killed_ones_lock_does_not_block(tmp_path):
    sweep, until = tmp_path / "sweep", tmp_path / "release"
    holder = subprocess.Popen(_cli(sweep, "+hydra.callbacks.hold._target_=tests.sweep_callbacks.HoldJob",
                                   "+hydra.callbacks.hold.job=1", f"+hydra.callbacks.hold.until={until}"),
                              cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not until.with_name("release.held").exists():  # job 0 finished, job 1 held at its start
            assert holder.poll() is None and time.monotonic() < deadline, holder.stderr.read()[-3000:]
            time.sleep(0.1)
        before = _digests(sweep)
        second = subprocess.run(_cli(sweep), cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240,
                                check=False)
        output = second.stdout + second.stderr
        assert second.returncode == 2, output[-3000:]
        assert "Traceback" not in output and "Launching" not in output
        said = [line for line in output.splitlines() if "in use by another sweep" in line]
        assert len(said) == 1 and f"(pid {holder.pid} on " in said[0], output[-3000:]
        assert _digests(sweep) == before, "the refused sweep changed the live one's directory"
        assert holder.poll() is None
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate(timeout=60)
    # The killed holder never released its lock, nor wrote its summary: the kernel released the lock.
    assert not (sweep / "sweep_summary.json").exists()
    state = sweep_state(sweep)
    assert (len(state.finished), state.planned, state.ended) == (1, 2, False)
    third = subprocess.run(_cli(sweep), cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240,
                           check=False)
    assert third.returncode == 0, (third.stdout + third.stderr)[-3000:]
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert [s["status"] for s in summary.values()] == ["skipped", "ok"]  # resumed: job 0 kept, job 1 run
    assert sweep_state(sweep).complete


def test_the_lock_is_held_while_open_and_free_once_closed(tmp_path):
    # flock locks belong to an open file: a second open in this process contends as another process would.
    fd = hold(tmp_path / "sweep", jobs=3)
    try:
        with pytest.raises(SweepDirInUse, match=rf"^hydra.sweep.dir={tmp_path / 'sweep'} is in use by another "
                                                rf"sweep \(pid {os.getpid()} on .*, since .*\): "):
            hold(tmp_path / "sweep", jobs=5)
        assert json.loads((tmp_path / "sweep" / SWEEP_LOCK).read_text())["jobs"] == 3  # the refused one wrote nothing
    finally:
        os.close(fd)
    os.close(hold(tmp_path / "sweep", jobs=5))
    assert json.loads((tmp_path / "sweep" / SWEEP_LOCK).read_text())["jobs"] == 5
