"""The ranks a driver spawns, joined once ready; each side watches the other's death, and the driver
its ranks' steps: one that hangs mid-step ends the run naming it (watch_steps)."""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from sarathi_lab.model.parallel.group import JOIN_TIMEOUT_S, LOOPBACK, RankGroup, join
from sarathi_lab.model.parallel.worker import serve

POLL_S = 0.2
# The store's key, per rank, of a rank started and about to join.
READY = "sarathi/ready"
# A starting rank imports (torch, the engine) and so keeps a CPU busy: one whose CPU time stands
# still this long before it started hangs (stopped, or blocked on a lock or a read).
STALL_S = 5.0
# Mid-step a rank waiting for another uses no CPU, but the one it waits for (or the driver) does:
# a step in which no process of the group has for this long hangs (a rank stopped, or all blocked).
STEP_STALL_S = 10.0


def start(size: int, port: int) -> list:
    """Spawned: a forked copy of a driver holding threads or CUDA is unsafe."""
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=rank_main, args=(r, size, port), daemon=True,
                                 name=f"sarathi-rank{r}") for r in range(1, size)]
    with _without_main_script(), _sigint_ignored():
        for process in processes:
            process.start()
    return processes


@contextlib.contextmanager
def _without_main_script() -> Iterator[None]:
    """Children re-run ``__main__``: stdin cannot be re-read, an unguarded script respawns."""
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
    """Ranks start with SIGINT ignored: Ctrl-C reaches the whole group; the driver alone answers."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set a handler
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def rank_main(rank: int, size: int, port: int) -> None:
    """It leaves as soon as the driver is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    driver = multiprocessing.parent_process()
    threading.Thread(target=_leave_with, args=(driver,), name="sarathi-driver-watch",
                     daemon=True).start()
    try:
        store = _store(port, size, master=False)
        store.set(_ready(rank), "1")
        serve(join(rank, size, store=store))
    except Exception:
        if not driver.is_alive():
            os._exit(1)  # the driver's death broke the collective
        raise
    # torch's teardown would keep the driver's exit waiting for seconds, and nothing outlives it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _store(port: int, size: int, master: bool):
    return dist.TCPStore(LOOPBACK, port, size, is_master=master, wait_for_workers=False,
                         timeout=timedelta(seconds=JOIN_TIMEOUT_S))


def _leave_with(driver) -> None:
    """The driver's pipe to this rank closes only when the driver dies (or drops this rank)."""
    driver.join()
    os._exit(1)


def _ready(rank: int) -> str:
    return f"{READY}/{rank}"


def join_spawned(processes: list, size: int, port: int) -> RankGroup:
    """Watching the ranks until all are ready: a dead or hung one would hold the join to
    JOIN_TIMEOUT_S."""
    spawned = RankGroup(0, size, 0, None, processes)
    try:
        store = _store(port, size, master=True)
        _wait_started(spawned, store)
        group = join(0, size, store=store)
    except BaseException:
        kill(processes)  # a rank left behind would wait for the driver to join
        raise
    group.processes = processes
    watch_steps(group)
    return group


def _wait_started(spawned: RankGroup, store) -> None:
    deadline, stalls = time.monotonic() + JOIN_TIMEOUT_S, _Stalls(_rank_stats(spawned))
    while waiting := [r for r in range(1, spawned.size) if not store.check([_ready(r)])]:
        if dead := spawned.dead_ranks():
            raise RuntimeError(died_joining(spawned.size, dead))
        if hung := stalls.of(waiting, STALL_S):
            raise RuntimeError(f"{spawned.size} ranks: " + ", ".join(f"rank {r}" for r in hung)
                               + f" used no CPU for {STALL_S:g} s before it started (it hangs: "
                               "stopped, or blocked on a lock or a read), so the run stops")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{spawned.size} ranks: "
                               + ", ".join(f"rank {r}" for r in waiting)
                               + f" not started within {JOIN_TIMEOUT_S:g} s, so the run stops")
        time.sleep(POLL_S)  # where Ctrl-C lands, ending the ranks below


def _rank_stats(group: RankGroup) -> dict[int, Path]:
    return {r: Path(f"/proc/{p.pid}/stat") for r, p in enumerate(group.processes, start=1)}


class _Stalls:
    """Each rank's CPU time (Linux's /proc; elsewhere none is told) and since when it stands."""

    def __init__(self, stats: dict[int, Path]) -> None:
        self.stats = stats
        self.seen: dict[int, tuple[int, float]] = {}

    def of(self, ranks: list[int], stall_s: float) -> list[int]:
        now, hung = time.monotonic(), []
        for rank in ranks:
            ticks = _cpu_ticks(self.stats[rank])
            if ticks is None:
                continue
            last = self.seen.get(rank)
            if last is None or last[0] != ticks:
                self.seen[rank] = (ticks, now)
            elif now - last[1] >= stall_s:
                hung.append(rank)
        return hung


def _stat_fields(stat: Path) -> list[str] | None:
    try:
        return stat.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _cpu_ticks(stat: Path) -> int | None:
    """User and system time, in clock ticks."""
    try:
        fields = _stat_fields(stat)
        return int(fields[11]) + int(fields[12])
    except (TypeError, IndexError, ValueError):
        return None


def watch_steps(group: RankGroup) -> None:
    """Until the ranks are gone: a step in which no process of the group used CPU for
    STEP_STALL_S hangs, and a collective would wait for it to collective_timeout_s. Its ranks
    are ended (their connections close, so the driver's wait ends at once) and ``group.stalled``
    says why, naming the ranks stopped. A slow rank uses CPU, and so does the driver's part."""
    threading.Thread(target=_watch_steps, args=(group,), name="sarathi-step-watch",
                     daemon=True).start()


def _state(stat: Path) -> str:
    """'R' running, 'S' asleep, 'T' stopped, 'Z' dead but not yet reaped; '' gone."""
    return (_stat_fields(stat) or [""])[0]


def _watch_steps(group: RankGroup) -> None:
    ranks = _rank_stats(group)
    stats, stepping = dict(ranks), None
    stalls = _Stalls(stats)
    while any(_state(stat) not in ("", "Z") for stat in ranks.values()):
        time.sleep(POLL_S)
        if group.stepping != stepping:  # a step begun or ended: its stall counted afresh
            stepping, stalls.seen = group.stepping, {}
            # Rank 0: the driver's thread waiting on the step (its part computed there).
            stats[0] = Path(f"/proc/{os.getpid()}/task/{stepping}/stat")
        if stepping is None or len(stalls.of(list(stats), STEP_STALL_S)) < len(stats):
            continue
        stopped = [r for r, stat in ranks.items() if _state(stat) in ("T", "t")]
        who = ", ".join(f"rank {r}" for r in stopped or ranks)
        group.stalled = (f"{group.label or f'{group.size} ranks'}: {who} "
                         + ("stopped" if stopped else "blocked (on a lock or a read)")
                         + f" mid-step: no rank used CPU for {STEP_STALL_S:g} s, so the run stops")
        for process in group.processes:
            process.kill()
        return


# Sent by the watch below to the driver's main thread, whose handler raises RankDied.
WATCH_SIGNAL = signal.SIGUSR2


class RankDied(RuntimeError):
    """A rank died while the engine was built; its line says which."""


def rank_died(error: BaseException | None) -> RankDied | None:
    """The watch's, wherever the code it interrupted wrapped it (an import wraps what it meets)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, RankDied):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


@contextlib.contextmanager
def watching(group: RankGroup) -> Iterator[None]:
    """While the driver builds its part, a rank that dies ends the start within POLL_S: its
    shard's build would otherwise run to its end (an import, weights) before a collective fails.
    A wait inside a collective ends anyway: the dead rank's connections close."""
    if not group.processes or threading.current_thread() is not threading.main_thread():
        yield
        return
    stop = threading.Event()

    def died(signum, frame) -> None:
        raise RankDied(f"{group.label or f'{group.size} ranks'}: "
                           + ", ".join(f"rank {r} (exit code {code}{_signal_name(code)})"
                                       for r, code in group.dead_ranks())
                           + " died while the engine was built, so the run stops; a rank's own "
                           "error, where it printed one, is above")

    main = threading.main_thread().ident

    def watch() -> None:
        while not stop.wait(POLL_S):
            if group.dead_ranks():
                # A signal proper, so that a wait in a system call (a sleep, a read) ends too.
                signal.pthread_kill(main, WATCH_SIGNAL)
                return

    previous = signal.signal(WATCH_SIGNAL, died)
    watcher = threading.Thread(target=watch, name="sarathi-rank-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        try:
            watcher.join()  # a signal it sent lands here at the latest
        finally:
            signal.signal(WATCH_SIGNAL, previous)


def died_joining(size: int, dead: list[tuple[int, int]]) -> str:
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
