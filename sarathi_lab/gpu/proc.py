"""Waiting for a child process group within the call's budget."""
from __future__ import annotations

import os
import signal
import subprocess


def wait_or_stop(proc: subprocess.Popen, timeout: float | None, grace: float) -> int | None:
    """The process's exit status, or None when it outran ``timeout``: then its whole group (it was
    started with start_new_session) gets SIGTERM, so runs save what they measured, and SIGKILL
    ``grace`` seconds later."""
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
