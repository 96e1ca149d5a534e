"""SIGINT and SIGTERM as one exception, so a run saves its partial records the same way; noted and
raised again each iteration, as a finalizer can swallow it (costing an iteration, not the run)."""
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
    """Python 3.11 wraps an exception raised while a class is built in a RuntimeError."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, Interrupted):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def raise_if_interrupted() -> None:
    """Raise Interrupted again for a signal received here and swallowed."""
    if _received:
        raise Interrupted(_received[0])


@contextmanager
def deferred_signals(*signums: int, raise_at_end: bool = True) -> Iterator[list[int]]:
    """Signals held until the block ends; ``raise_at_end``: then the first as Interrupted."""
    received: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in signums}
    try:
        yield received
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    if received and raise_at_end:
        raise Interrupted(received[0])
