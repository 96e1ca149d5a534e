"""Ctrl-C of a submitit sweep ends its jobs: the launcher's cancellation with a fake executor whose
jobs are real processes (tests/test_signals.py runs a whole sweep): a signal while the jobs start
takes down every job started, and a second signal while they are stopped cuts the grace short
instead of leaving them running."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest
import submitit
from omegaconf import OmegaConf

from hydra_plugins.sarathi_lab_launcher import submitit_launcher as launcher_module
from hydra_plugins.sarathi_lab_launcher.submitit_launcher import LocalLauncher
from sarathi_lab.harness.interrupts import Interrupted, deferred_signals, signals_interrupt

# A job's run that outlives SIGTERM (a run busy saving), so only SIGKILL ends it.
STUBBORN = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
            "time.sleep(120)")


class FakeJob:
    def __init__(self, num: int, stubborn: bool):
        code = STUBBORN if stubborn else "import time; print('up', flush=True); time.sleep(120)"
        self._process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        self._process.stdout.readline()  # its handler is in place
        self.job_id = str(self._process.pid)
        self.num = num

    def done(self) -> bool:
        return self._process.poll() is not None


class FakeExecutor:
    """submitit.AutoExecutor's surface the launcher uses; map_array starts real processes and is
    signalled (as by Ctrl-C) after the second has started."""
    stubborn = False
    started: ClassVar[list[FakeJob]] = []

    def __init__(self, **kwargs):
        pass

    def update_parameters(self, **kwargs):
        pass

    def map_array(self, fn, overrides, dirs, nums, ids, states):
        for num in nums:
            FakeExecutor.started.append(FakeJob(num, self.stubborn))
            if len(FakeExecutor.started) == 2:
                os.kill(os.getpid(), signal.SIGINT)
        return list(FakeExecutor.started)


def _launcher(sweep: Path) -> LocalLauncher:
    launcher = LocalLauncher.__new__(LocalLauncher)
    launcher.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    launcher.params = {"submitit_folder": str(sweep / ".submitit")}
    launcher._job_dir = lambda num, overrides, job_id: sweep / str(num)
    return launcher


@pytest.fixture
def fake_executor(monkeypatch):
    monkeypatch.setattr(submitit, "AutoExecutor", FakeExecutor)
    FakeExecutor.started = []
    yield FakeExecutor
    for job in FakeExecutor.started:
        if not job.done():
            job._process.kill()
        job._process.wait()


def test_a_signal_while_the_jobs_start_takes_every_started_job_down(tmp_path, fake_executor, monkeypatch):
    monkeypatch.setattr(launcher_module, "GRACE_S", 5.0)
    with pytest.raises(SystemExit) as ended:
        _launcher(tmp_path / "sweep").launch([["chunk=16"], ["chunk=32"], ["chunk=64"]], 0)
    assert ended.value.code == 128 + signal.SIGINT
    assert len(fake_executor.started) == 3
    for job in fake_executor.started:  # was: the jobs started before the signal ran on, `running`
        job._process.wait(timeout=10)
    statuses = [(tmp_path / "sweep" / str(n) / "status.json").read_text() for n in range(3)]
    assert all('"interrupted"' in s for s in statuses)


def test_a_second_signal_while_the_jobs_stop_cuts_the_grace_short(tmp_path, fake_executor, monkeypatch):
    monkeypatch.setattr(launcher_module, "GRACE_S", 60.0)
    fake_executor.stubborn = True
    jobs = [FakeJob(n, stubborn=True) for n in range(2)]
    fake_executor.started = jobs
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    began = time.monotonic()
    _launcher(tmp_path / "sweep")._take_down(jobs, [0, 1], [["a=1"], ["a=2"]], time.time(), Interrupted(signal.SIGINT))
    assert time.monotonic() - began < 30  # was: a KeyboardInterrupt out of the wait, the jobs left running
    for job in jobs:
        assert job._process.wait(timeout=10) == -signal.SIGKILL


def test_deferred_signals_raise_once_the_block_is_done():
    done = []
    with pytest.raises(Interrupted), signals_interrupt(signal.SIGINT), deferred_signals(signal.SIGINT):
        os.kill(os.getpid(), signal.SIGINT)
        done.append("finished")
    assert done == ["finished"]
