"""SIGINT and SIGTERM as one exception, so a run saves its partial records the same way; noted and
raised again each iteration, as a finalizer can swallow it (costing an iteration, not the run)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path


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
def signals_interrupt(*signums: int, on_signal: Callable[[int], None] | None = None
                      ) -> Iterator[None]:
    """``on_signal(signum)`` runs in the handler, before the exception: what must be recorded even
    where that exception is swallowed (a library's import can) or the process is killed before it
    is handled (a parent's grace running out)."""
    def handler(signum, frame):
        _received.append(signum)
        if on_signal is not None:
            with suppress(OSError):  # a full disk: whoever catches the exception writes again
                on_signal(signum)
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


# What a child gets, once the signal that stopped its parent is passed on, to record its run as
# interrupted and leave; then its group is killed.
CHILD_GRACE_S = 15.0


def start_child(command: list[str], **popen) -> subprocess.Popen:
    """In a process group of its own (the children it starts too), which end_child ends whole."""
    return subprocess.Popen(command, start_new_session=True, **popen)


def _started(pid: int) -> str | None:
    """A process's start time (/proc), so that a pid reused since is told apart; None: gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def _descendants(pid: int) -> dict[int, str]:
    """pid -> start time of every process below ``pid`` (Linux; none found elsewhere)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        with suppress(OSError, IndexError, ValueError):
            parent = int(entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1])
            parents.setdefault(parent, []).append(int(entry.name))
    found, todo = {}, [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if (started := _started(child)) is not None:
                found[child] = started
                todo.append(child)
    return found


def end_child(proc: subprocess.Popen, signum: int = signal.SIGTERM,
              grace_s: float = CHILD_GRACE_S) -> int:
    """``signum`` to the child's group, SIGKILL ``grace_s`` later to what is left of it and of
    the processes below it then (one in a session of its own too); further signals wait
    meanwhile. The child's exit status."""
    with deferred_signals(signal.SIGINT, signal.SIGTERM, raise_at_end=False):
        below = _descendants(proc.pid)
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)
        try:
            code = proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            code = None
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pid, started in below.items():
            if _started(pid) == started:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return proc.wait() if code is None else code


def signal_of(error: BaseException) -> int:
    """The signal a KeyboardInterrupt came by (ours say; Python's own is SIGINT), else SIGTERM."""
    if (interrupted := interruption_of(error)) is not None:
        return interrupted.signum
    return signal.SIGINT if isinstance(error, KeyboardInterrupt) else signal.SIGTERM


def run_child(command: list[str], **popen) -> int:
    """Its exit status; this process stopped (a signal, any error) ends the child's group first."""
    proc = start_child(command, **popen)
    try:
        return proc.wait()
    except BaseException as e:
        end_child(proc, signal_of(e))
        raise
