"""SIGINT or SIGTERM to a command that started other processes ends all of them within 20 s: produce
and floor_claims (their sweeps, simulated), `measure` and the GPU suite's local mode (its worker and
the sweep it started); a run under way is recorded as interrupted, and the command says how to go
on. Each starts the command as a user does, sends the signal to it alone (as `kill` does) once a
run is under way, and waits at most a bounded time."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_floor_claims import SWEEP, _lease

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
ENDED_WITHIN_S = 20
# Long enough that the signal lands in a run: each job simulates this many requests.
LONG_JOBS = "workload.num_requests=30000"


def _env(**more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    return env | {"PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"} | more


def _descendants(pid: int) -> set[int]:
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            parents.setdefault(int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]), []).append(
                int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _statuses(root: Path) -> list[str]:
    found = []
    for path in root.rglob("status.json"):
        try:
            found.append(json.loads(path.read_text())["status"])
        except (OSError, ValueError, KeyError):
            continue
    return found


def _signal_mid_run(command: list[str], root: Path, signum: int, env: dict, **popen) -> tuple[str, list[str]]:
    """(its output, the statuses under ``root`` after): the signal sent once a run under ``root`` is
    running; every process of the command's tree gone within ENDED_WITHIN_S."""
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, **popen)
    try:
        deadline = time.monotonic() + 240
        while "running" not in _statuses(root):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
            time.sleep(0.1)
        tree = _descendants(proc.pid)
        assert tree, "a run under way has a process of its own"
        os.kill(proc.pid, signum)
        sent = time.monotonic()
        output = proc.communicate(timeout=ENDED_WITHIN_S)[0]
        while any(map(_alive, tree)) and time.monotonic() - sent < ENDED_WITHIN_S:
            time.sleep(0.1)
        assert not [p for p in tree if _alive(p)], f"left running: {tree}"
        assert proc.returncode == 128 + signum, output[-3000:]
        return output, _statuses(root)
    finally:  # a regression's processes are not left to the next test
        for pid in [*_descendants(proc.pid), proc.pid]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("signum, ignored", [(signal.SIGINT, False), (signal.SIGTERM, False),
                                             (signal.SIGINT, True)])
def test_a_signal_to_produce_ends_its_sweep_records_the_run_and_says_how_to_resume(tmp_path, signum, ignored):
    # ignored: started in the background of a script, SIGINT ignored from the start (it ran on).
    command = [sys.executable, "-m", "sarathi_lab.produce", "pd_ratio", "decode_speedup", "--sim", "--scale",
               "ci", "--root", str(tmp_path), "-o", LONG_JOBS]
    output, statuses = _signal_mid_run(command, tmp_path, signum, _env(), preexec_fn=(
        (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignored else None))
    assert "interrupted" in statuses and "running" not in statuses
    name = signal.Signals(signum).name
    last = output.strip().splitlines()[-1]
    assert last.startswith(f"interrupted ({name}): pd_ratio's sweep in {tmp_path}/pd_ratio/multiruns/ci-"), last
    assert "the command above resumes it; not started: decode_speedup (python -m sarathi_lab.produce " \
           f"decode_speedup --root {tmp_path} --scale ci -o {LONG_JOBS} --sim)" in last
    assert "to resume this sweep" in output and "Traceback" not in output


def test_sigterm_to_floor_claims_ends_the_sweep_it_started(tmp_path):
    folder = _lease(tmp_path, [SWEEP.replace("workload.num_requests=8", LONG_JOBS)])
    runs = tmp_path / "runs"
    runs.mkdir()
    command = [sys.executable, "-m", "sarathi_lab.measure", "floor_claims", str(folder)]
    output, _ = _signal_mid_run(command, runs, signal.SIGTERM, _env(TMPDIR=str(runs)))
    assert output.strip().splitlines()[-1] == (
        "interrupted (SIGTERM): the simulator's sweeps are ended, nothing was written; the same command "
        "starts over")
    assert not list(tmp_path.rglob("*.floor_claims.csv"))


def test_sigterm_to_the_gpu_suite_s_local_mode_ends_its_worker_and_sweep(tmp_path):
    out = tmp_path / "gpu"
    command = [sys.executable, "-m", "sarathi_lab.measure", "gpu", "--dry-run", "--out", str(out), "--steps",
               "paper.decode_speedup"]
    output, statuses = _signal_mid_run(command, out, signal.SIGTERM, _env())
    assert "interrupted" in statuses and "running" not in statuses
    result = json.loads((out / "steps" / "paper.decode_speedup" / "result.json").read_text())
    assert (result["status"], result["error"]) == ("incomplete", "interrupted")
    assert "[gpu] interrupted: the same command resumes" in output


def _handles(pid: int, signum: int) -> bool:
    """Whether ``pid`` has a handler of its own for ``signum`` (/proc's SigCgt mask)."""
    for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def test_sigterm_to_measure_ends_it_and_says_nothing_was_written(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "sarathi_lab.measure", "sim_pipeline", "--out", str(tmp_path)],
                            cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not _handles(proc.pid, signal.SIGTERM):  # its work started
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=ENDED_WITHIN_S)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and err.strip().splitlines()[-1] == (
        "interrupted (SIGTERM): sim_pipeline stopped and the processes it started with it; its tables are not "
        "written; the same command starts it over")
    assert not list(tmp_path.iterdir())
