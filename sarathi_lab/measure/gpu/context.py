"""What a step runs with, how it says it could not finish, and how it waits for a child."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


class Unavailable(Exception):
    """What the step needs is not in this checkout yet."""


class Incomplete(Exception):
    """The step ran out of time; a rerun continues it."""


@dataclass(frozen=True)
class Context:
    out: Path                 # the suite's out directory
    dir: Path                 # this step's own folder in it
    dry_run: bool             # tiny shapes on the CPU
    device: str               # "cuda" or "cpu"
    deadline: float | None    # time.time() by which the call ends (subprocess timeouts)

    def seconds_left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.time())


def wait_or_stop(proc: subprocess.Popen, timeout: float | None, grace: float) -> int | None:
    """Exit status, or None past ``timeout``: SIGTERM to the group, SIGKILL ``grace`` s later."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return None
