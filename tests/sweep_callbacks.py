"""Test-only Hydra callbacks that stop or hold a real sweep at a chosen job, added on its command line
(`+hydra.callbacks.NAME._target_=tests.sweep_callbacks.CLASS`), so that tests can interrupt or
overlap real sweeps at a known point instead of guessing at timings."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from hydra.experimental.callback import Callback


class InterruptAtJob(Callback):
    """SIGINT to the sweep's own process as job ``job`` starts (basic launcher: the jobs before it
    have finished), as a Ctrl-C between two jobs does."""

    def __init__(self, job: int) -> None:
        self.job = job

    def on_job_start(self, config, **kwargs) -> None:
        if config.hydra.job.num == self.job:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)  # the signal's handler ends the process long before


class HoldJob(Callback):
    """Holds job ``job`` at its start until the file ``until`` exists, having made ``until``.held:
    the sweep is alive, between its jobs, for as long as a test needs."""

    def __init__(self, job: int, until: str) -> None:
        self.job, self.until = job, Path(until)

    def on_job_start(self, config, **kwargs) -> None:
        if config.hydra.job.num == self.job:
            self.until.with_name(self.until.name + ".held").touch()
            deadline = time.monotonic() + 300
            while not self.until.exists() and time.monotonic() < deadline:
                time.sleep(0.05)


class AlarmAtJob(Callback):
    """SIGALRM to the sweep's own process as job ``job`` starts: the call's deadline falling between
    two jobs of a sweep run in the GPU worker's process (measure/gpu/sweep_here.py)."""

    def __init__(self, job: int) -> None:
        self.job = job

    def on_job_start(self, config, **kwargs) -> None:
        if config.hydra.job.num == self.job:
            os.kill(os.getpid(), signal.SIGALRM)
            time.sleep(30)  # the signal's handler stops the sweep long before
