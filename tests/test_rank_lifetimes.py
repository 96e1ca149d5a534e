"""Spawned ranks' lives tied to the driver's, both ways, with real processes: scripts read on stdin
or without a `__main__` guard run (their ranks died as they started and the driver waited for its
join timeout); a rank that dies while the ranks join ends the start at once with a line naming it,
one that hangs (stopped) within 10 s;
the driver's SIGKILL ends its ranks; SIGINT and SIGTERM end a parallel run at once, with its
partial records and no rank's traceback. Every wait is bounded: a regression fails, never hangs."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path

import pytest

from sarathi_lab.host_features import usable_cores
from sarathi_lab.model.parallel import driver, group, spawn

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(usable_cores() < 2, reason="two ranks need two cores")]

ROOT = Path(__file__).resolve().parents[1]
# A start of two tiny ranks on a loaded two-core machine takes tens of seconds; a rank that dies or
# a driver that hangs must not make the test wait the join timeout's five minutes.
START_S = 240
SCRIPT = """from sarathi_lab import LLM
print("module level ran", flush=True)
llm = LLM("tiny", tensor_parallel=2, device="cpu", dtype="float32", num_threads=1, warmup_iters=0)
print("tokens", llm.generate([[1, 2, 3]], 3))
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env | {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "WANDB_MODE": "disabled"}


@pytest.mark.parametrize("how", ["stdin", "file"])
def test_a_script_on_stdin_or_without_the_main_guard_runs_on_two_ranks(how, tmp_path):
    # Each rank re-ran the driver's __main__: '<stdin>' could not be found, and a guard-less script
    # spawned again while bootstrapping; either way rank 1 died and the driver waited 300 s.
    (tmp_path / "script.py").write_text(SCRIPT)
    command = [sys.executable, "-" if how == "stdin" else "script.py"]
    done = subprocess.run(command, input=SCRIPT if how == "stdin" else None, cwd=tmp_path,
                          env=_env(), capture_output=True, text=True, timeout=START_S, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("module level ran") == 1  # never again in a rank
    assert re.search(r"^tokens \[\[\d+, \d+, \d+\]\]$", done.stdout, re.MULTILINE), done.stdout
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


def _start_with_rank_1(monkeypatch, done_to_it: Callable[[BaseProcess], object]) -> None:
    """The next driver.ranks(2) starts its ranks with ``done_to_it`` done to rank 1 at once; the
    join timeout bounded at two minutes, a regression's wait."""
    for module in (group, spawn):
        monkeypatch.setattr(module, "JOIN_TIMEOUT_S", 120.0)
    started = spawn.start

    def start(size, port):
        processes = started(size, port)
        done_to_it(processes[0])
        return processes

    monkeypatch.setattr(spawn, "start", start)
    driver.close()  # a group of 2 left by an earlier test in this process would be reused, not started


def _the_next_start_joins(monkeypatch) -> None:
    """Nothing of the failed start is kept or left waiting (its ranks were ended with it): the next
    one, unhindered, joins."""
    assert driver._ranks is None
    monkeypatch.undo()
    try:
        assert driver.ranks(2).size == 2
    finally:
        driver.close()


def test_a_rank_that_dies_while_the_ranks_join_ends_the_start_with_a_line_naming_it(monkeypatch):
    _start_with_rank_1(monkeypatch, lambda rank: rank.kill())  # before it could join
    begun = time.monotonic()
    named = r"^2 ranks: rank 1 \(exit code -9: killed by SIGKILL\) died before the ranks joined"
    with pytest.raises(RuntimeError, match=named) as e:
        driver.ranks(2)
    assert time.monotonic() - begun < group.JOIN_TIMEOUT_S / 4  # seconds, not the join timeout
    assert "\n" not in str(e.value)
    _the_next_start_joins(monkeypatch)


def test_a_rank_that_hangs_before_it_started_ends_the_start_within_10_s(monkeypatch):
    # The driver waited for the join timeout (five minutes; here bounded at two).
    stopped = []

    def stop(rank):
        os.kill(rank.pid, signal.SIGSTOP)  # alive, never answering
        stopped.append(time.monotonic())

    _start_with_rank_1(monkeypatch, stop)
    named = (r"^2 ranks: rank 1 used no CPU for 5 s before it started \(it hangs: stopped, or "
             r"blocked on a lock or a read\), so the run stops$")
    with pytest.raises(RuntimeError, match=named):
        driver.ranks(2)
    assert time.monotonic() - stopped[0] < 10
    _the_next_start_joins(monkeypatch)


def test_a_rank_that_dies_while_the_engine_is_built_ends_the_start_within_10_s(monkeypatch):
    # The driver built its own part to the end (an import, its weights) before a collective failed.
    from sarathi_lab import LLM

    real, killed = driver.build_rank, []

    def slow_build(spec, group, groups):
        group.processes[0].kill()  # rank 1 cannot build its part
        killed.append(time.monotonic())
        time.sleep(60)  # the driver's own part: a long build in Python
        return real(spec, group, groups)

    monkeypatch.setattr(driver, "build_rank", slow_build)
    named = (r"^tensor_parallel=2: rank 1 \(exit code -9: killed by SIGKILL\) died while the engine was built, so "
             r"the run stops")
    try:
        with pytest.raises(RuntimeError, match=named) as e:
            LLM("tiny", tensor_parallel=2, device="cpu", dtype="float32", num_threads=1, warmup_iters=0)
        assert time.monotonic() - killed[0] < 10 and "\n" not in str(e.value)
        assert driver._ranks is None
    finally:
        driver.close()


def _children(pid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
            if proc.name.isdigit() and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(proc.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _maps_torch(pid: int) -> bool:
    try:
        return "libtorch_cpu" in (Path("/proc") / str(pid) / "maps").read_text()
    except OSError:
        return False


def test_the_drivers_sigkill_while_its_ranks_join_ends_them():
    # Rank 0 never joins (it sleeps once rank 1 is ready), so rank 1 waits in init_process_group,
    # as it did for up to the join timeout once the driver was killed.
    code = ("import time; from sarathi_lab.model.parallel import driver, spawn\n"
            "spawn.join = lambda *a, **k: time.sleep(600)\n"
            "driver.ranks(2)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], env=_env(), stderr=subprocess.PIPE,
                            text=True)
    children: list[int] = []
    try:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline and not any(_maps_torch(c) for c in children):
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            children = _children(proc.pid)
            time.sleep(0.2)
        time.sleep(2)  # torch imported: the rank goes on to wait for the driver's join
        assert any(_alive(c) for c in children)
        proc.kill()
        proc.wait(timeout=30)
        until = time.monotonic() + 30
        while time.monotonic() < until and any(_alive(c) for c in children):
            time.sleep(0.2)
        assert not [c for c in children if _alive(c)], "the ranks outlived their driver"
    finally:
        for pid in [proc.pid, *children]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.stderr.close()


@pytest.mark.parametrize(("signum", "whole_group"), [
    pytest.param(signal.SIGINT, True, id="ctrl-c"), pytest.param(signal.SIGTERM, False, id="kill")])
def test_a_signal_mid_run_ends_a_parallel_run_at_once_with_partial_records(signum, whole_group,
                                                                          tmp_path):
    # A terminal's Ctrl-C reaches every process of its group: rank 1 printed a 60-line traceback;
    # `kill` reaches the driver alone, which waited 20 s for ranks stuck mid-step.
    run, said = tmp_path / "run", tmp_path / "said.txt"
    with said.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sarathi_lab.run", "experiment=smoke",
                                 "logger=none", "engine.tensor_parallel=2", "device=cpu",
                                 "device.num_threads=1", "workload.num_requests=4000",
                                 f"hydra.run.dir={run}"], cwd=tmp_path, env=_env(),
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + START_S
        # The progress line, logged every 10 s once tokens flow: the run is mid-run.
        while (proc.poll() is None and time.monotonic() < deadline
               and "requests done" not in said.read_text()):
            time.sleep(0.2)
        assert proc.poll() is None, said.read_text()[-3000:]
        ranks = _children(proc.pid)
        (os.killpg if whole_group else os.kill)(proc.pid, signum)
        sent = time.monotonic()
        proc.wait(timeout=60)
        took = time.monotonic() - sent
        time.sleep(2)
        outlived = [pid for pid in ranks if _alive(pid)]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = said.read_text()
    assert proc.returncode == 128 + signum, text[-3000:]
    assert took < 10, f"{took:.1f} s from the signal to the exit"
    assert "Traceback" not in text, text[-3000:]
    assert not outlived, "ranks outlived the run"
    kept = {p.name for p in run.glob("*.partial.*")}
    assert kept >= {"metrics.partial.json", "iterations.partial.parquet"}, kept


def test_only_the_run_s_own_process_ends_past_the_interpreter_s_teardown(monkeypatch):
    # A process that joined ranks ends by os._exit once its exit handlers ran; one that hosts the
    # run (the GPU suite's worker, this test process) goes on after it.
    from sarathi_lab import run

    assert not run._owns_the_process()
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "sarathi_lab.run", "experiment=smoke"])
    assert run._owns_the_process()
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "sarathi_lab.measure", "gpu"])
    assert not run._owns_the_process()
