"""A paper step's sweep as ``python -m sarathi_lab.run -m ...`` runs it, but in the worker's own
process: the worker's paper (and profile) steps run one after another in one process, so their jobs
share the process's engine (model/shared_engine.py: the model built once, CUDA graphs captured once
per set of shapes) across steps as one sweep's jobs do, and the interpreter, the imports and the
model's build are paid once per process, not once per step.

The command runs as its module, not imported (the command line sits above this layer), with what a
process of its own would have given it back as it was: stdout and stderr (into the step's log),
``sys.argv``, the signal handlers and the logging handlers it replaces. Past ``seconds`` it is
stopped as the call's deadline stopped it in a process of its own: its job records itself
interrupted, its finished jobs stay, and a rerun goes on from there."""
from __future__ import annotations

import logging
import os
import runpy
import signal
import sys
from pathlib import Path

from sarathi_lab.harness.interrupts import Interrupted
from sarathi_lab.harness.sweep_state import SWEEP_LOCK

COMMAND = "sarathi_lab.run"
# The signals the command handles itself; SIGALRM is the deadline's.
HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)


def run_sweep(args: list[str], log: Path, seconds: float | None) -> int | None:
    """``python -m sarathi_lab.run *args``'s exit status, run here with its output appended to
    ``log``; None where it ran past ``seconds`` and was stopped. A signal that stopped it from
    outside (the driver's SIGTERM) is raised again as Interrupted, as the worker's own."""
    deadline: list[bool] = []

    def stop(signum, frame) -> None:
        deadline.append(True)
        raise Interrupted(signal.SIGTERM)  # what the deadline sent the command in its own process

    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved_fds, argv = (os.dup(1), os.dup(2)), sys.argv[:]
    handlers = {s: signal.getsignal(s) for s in HANDLED}
    root = logging.getLogger()
    root_handlers, root_level = root.handlers[:], root.level
    code: int | None = None
    streams = sys.stdout, sys.stderr
    with open(log, "a", buffering=1) as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        # Its handlers write to sys.stdout as they find it (a test's capture, say), not to fd 1.
        sys.stdout = sys.stderr = out
        try:
            signal.signal(signal.SIGALRM, stop)
            if seconds is not None:
                signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
            sys.argv = [COMMAND, *args]
            try:
                runpy.run_module(COMMAND, run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else int(e.code is not None)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            if deadline:
                print("the call's deadline stopped the sweep: its finished jobs are kept, and the "
                      "step run again goes on from there", file=out)
            out.flush()
            sys.stdout, sys.stderr = streams
            for fd, saved in zip((1, 2), saved_fds):
                os.dup2(saved, fd)
                os.close(saved)
            sys.argv = argv
            for s, h in handlers.items():
                signal.signal(s, h)
            for h in root.handlers:
                if h not in root_handlers:
                    h.close()
            root.handlers[:] = root_handlers
            root.setLevel(root_level)
    _release_locks()
    if deadline:
        return None
    if code is not None and code > 128 and code - 128 in (signal.SIGINT, signal.SIGTERM):
        raise Interrupted(code - 128)
    return code


def _release_locks() -> None:
    """The sweep lock a stopped sweep still holds (its callback's end never ran), released as its
    process's exit released it: else a rerun of the step in this process is refused as a sweep
    already under way. Sweeps here run one at a time: any lock the process holds is the last's."""
    fds = "/proc/self/fd"
    for fd in os.listdir(fds) if os.path.isdir(fds) else ():
        try:
            target = os.readlink(f"{fds}/{fd}")
        except OSError:
            continue
        if os.path.basename(target) == SWEEP_LOCK:
            os.close(int(fd))
