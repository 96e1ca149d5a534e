"""The ranks a driver spawns on its own machine: started without the driver's script, joined while
the driver watches that each is still alive, and each watching the driver in turn, so that no death
on either side leaves the other waiting."""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator

from sarathi_lab.model.parallel.group import JOIN_TIMEOUT_S, RankGroup, join
from sarathi_lab.model.parallel.worker import serve

# How often the driver looks at its ranks' liveness while they join.
POLL_S = 0.2


def start(size: int, init_method: str) -> list:
    """Ranks 1..size-1, each its own process (spawned: a forked copy of a driver holding threads or
    CUDA is unsafe)."""
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=rank_main, args=(r, size, init_method), daemon=True,
                                 name=f"sarathi-rank{r}") for r in range(1, size)]
    with _without_main_script(), _sigint_ignored():
        for process in processes:
            process.start()
    return processes


@contextlib.contextmanager
def _without_main_script() -> Iterator[None]:
    """multiprocessing re-runs the parent's ``__main__`` in each child, unless it has neither a spec
    nor a file (as in an interactive session). A rank needs none of it: a script read on stdin could
    not be re-read, and one without the ``if __name__ == "__main__":`` guard spawned again, so every
    rank died as it started."""
    main = sys.modules["__main__"]
    saved = {key: main.__dict__[key] for key in ("__spec__", "__file__") if key in main.__dict__}
    main.__spec__ = None
    main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        main.__dict__.update(saved)


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """The ranks start with SIGINT ignored (inherited through exec): a terminal's Ctrl-C reaches
    every process of its group, and the driver alone answers it, ending its ranks."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set a handler; rank_main ignores it once running
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def rank_main(rank: int, size: int, init_method: str) -> None:
    """A spawned rank (multiprocessing's target): it leaves as soon as the driver is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    driver = multiprocessing.parent_process()
    threading.Thread(target=_leave_with, args=(driver,), name="sarathi-driver-watch",
                     daemon=True).start()
    try:
        serve(join(rank, size, init_method))
    except Exception:
        if not driver.is_alive():
            os._exit(1)  # the driver's death broke the collective: nothing to say to nobody
        raise
    # Told to leave: the interpreter's teardown of torch would keep the driver's exit waiting for
    # seconds, and nothing of a rank outlives it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _leave_with(driver) -> None:
    """The driver's pipe to this rank closes only when the driver dies (or drops this rank)."""
    driver.join()
    os._exit(1)


def join_spawned(processes: list, size: int, init_method: str) -> RankGroup:
    """The driver joins its ranks in a thread while this one watches them: one that died (an import
    that failed, a kill) would keep the join waiting for every rank up to JOIN_TIMEOUT_S."""
    outcome: list = []

    def joining() -> None:
        try:
            outcome.append(join(0, size, init_method))
        except BaseException as e:  # noqa: BLE001 - handed to the watching thread, which raises it
            outcome.append(e)

    thread = threading.Thread(target=joining, name="sarathi-join", daemon=True)
    thread.start()
    spawned = RankGroup(0, size, 0, None, processes)
    try:
        while thread.is_alive():
            thread.join(POLL_S)
            if dead := spawned.dead_ranks():
                raise RuntimeError(died_joining(size, dead))
        if isinstance(outcome[0], BaseException):
            raise spawned.failure(outcome[0], JOIN_TIMEOUT_S) from outcome[0]
    except BaseException:
        kill(processes)  # Ctrl-C included: a rank left behind would wait for the driver to join
        raise
    outcome[0].processes = processes
    return outcome[0]


def died_joining(size: int, dead: list[tuple[int, int]]) -> str:
    """One line naming each rank that died before the ranks joined, its exit code and why."""
    who = ", ".join(f"rank {r} (exit code {code}{_signal_name(code)})" for r, code in dead)
    return (f"{size} ranks: {who} died before the ranks joined, so the run stops; a rank's own "
            f"error, where it printed one, is above")


def _signal_name(code: int | None) -> str:
    if code is None or code >= 0:
        return ""
    with contextlib.suppress(ValueError):
        return f": killed by {signal.Signals(-code).name}"
    return ""


def kill(processes: list) -> None:
    """End ranks at once: one stopped or mid-collective answers nothing else."""
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join(timeout=5.0)
