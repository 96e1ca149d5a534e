"""SIGINT and SIGTERM (what Slurm, submitit and `kill` send) as one exception, so a run saves its
partial records the same way whichever signal stopped it. A finalizer or a C extension's callback can
swallow the exception, so the handler also notes the signal and the engine's per-iteration hook
raises it again (raise_if_interrupted): a swallowed signal costs an iteration, not the run. Python
prints such a swallowed exception as "Exception ignored in ..." with its traceback; the block's
unraisable hook keeps that quiet for Interrupted alone, since it is raised again."""
from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager


class Interrupted(KeyboardInterrupt):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention for death by signal


# The signals the active signals_interrupt block has received (cleared as it ends).
_received: list[int] = []


@contextmanager
def signals_interrupt(*signums: int) -> Iterator[None]:
    def handler(signum, frame):
        _received.append(signum)
        raise Interrupted(signum)

    earlier_hook = sys.unraisablehook

    def unraisable(info) -> None:
        if not isinstance(info.exc_value, Interrupted):
            earlier_hook(info)

    previous = {s: signal.signal(s, handler) for s in signums}
    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        sys.unraisablehook = earlier_hook
        _received.clear()


def interruption_of(error: BaseException) -> Interrupted | None:
    """The Interrupted ``error`` is, or wraps: Python 3.11 wraps an exception raised where a class is
    being built (a dataclass field's __set_name__ while a module imports) in a RuntimeError."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, Interrupted):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def raise_if_interrupted() -> None:
    """Raise Interrupted again for a signal this signals_interrupt block received and something swallowed."""
    if _received:
        raise Interrupted(_received[0])


@contextmanager
def deferred_signals(*signums: int, raise_at_end: bool = True) -> Iterator[list[int]]:
    """The signals received in the block, noted and not raised there (the list it yields): work that
    must not stop half-way (starting a sweep's jobs, whose handles come back only once all have
    started) finishes first. ``raise_at_end``: the first one raised as Interrupted as the block ends."""
    received: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in signums}
    try:
        yield received
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    if received and raise_at_end:
        raise Interrupted(received[0])
