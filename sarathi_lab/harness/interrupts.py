"""SIGINT and SIGTERM (what Slurm, submitit and `kill` send) as one exception, so a run saves its
partial records the same way whichever signal stopped it."""
from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


class Interrupted(KeyboardInterrupt):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention for death by signal


@contextmanager
def signals_interrupt(*signums: int) -> Iterator[None]:
    def handler(signum, frame):
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
