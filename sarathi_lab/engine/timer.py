"""The one timer of every measurement; ``cpu``: process CPU time, comparable on a shared machine."""
from __future__ import annotations

import statistics
from collections.abc import Callable

import numpy as np
import torch

from sarathi_lab.config import AS_WRITTEN, check_choice
from sarathi_lab.engine.clock import Clock, CPUClock, WallClock

CLOCKS = ("wall", "cpu")
# The GPU sleeps ahead of each round so the host enqueues its calls first: events then time the
# kernels, not the launches (a decode's kernel takes microseconds, a Python launch tens of them).
ROUND_SLEEP_CYCLES = 1_000_000
# Several times the largest L2, so no line of the timed call's inputs survives the flush.
FLUSH_BYTES = 256 << 20


def make_clock(kind: str = "wall", device: torch.device | str = "cpu") -> Clock:
    check_choice("clock", kind, CLOCKS, AS_WRITTEN)
    if kind == "cpu":
        return CPUClock()
    return WallClock(torch.cuda.synchronize if torch.device(device).type == "cuda" else None)


def time_calls(fn: Callable[[], object], reps: int, clock: Clock, warmup: int = 1,
               before: Callable[[], object] | None = None) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        start = clock.now()
        fn()
        times.append(clock.now() - start)
    return times


def median_time(fn: Callable[[], object], reps: int, clock: Clock, warmup: int = 1,
                before: Callable[[], object] | None = None) -> float:
    return statistics.median(time_calls(fn, reps, clock, warmup, before))


def best_time(fn: Callable[[], object], reps: int, clock: Clock, warmup: int = 1) -> float:
    return min(time_calls(fn, reps, clock, warmup))


def interleaved(calls: dict[str, Callable[[], object]], reps: int,
                *clocks: Clock) -> dict[str, np.ndarray]:
    """Each round starts one call later: host speed drifts fall on every call alike."""
    names, times = list(calls), {name: [] for name in calls}
    for r in range(reps):
        for name in names[r % len(names):] + names[: r % len(names)]:
            start = [clock.now() for clock in clocks]
            calls[name]()
            times[name].append([clock.now() - t for clock, t in zip(clocks, start)])
    return {name: np.array(t) for name, t in times.items()}


def l2_flush(device: torch.device | str) -> Callable[[], object] | None:
    """Reading, not writing: dirty lines' write-back would land in the timed kernel."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return reading_flush(torch.zeros(FLUSH_BYTES // 4, dtype=torch.float32, device=device))


def reading_flush(buffer: torch.Tensor) -> Callable[[], object]:
    flat, out = buffer.view(-1), torch.empty((), dtype=buffer.dtype, device=buffer.device)
    return lambda: torch.sum(flat, dim=0, out=out)


def time_interleaved(calls: dict[str, Callable[[], object]], reps: int, device: torch.device,
                     warmup: int) -> dict[str, list[float]]:
    for fn in calls.values():
        for _ in range(warmup):
            fn()
    if device.type != "cuda":
        return {name: (t[:, 0] * 1e3).tolist()
                for name, t in interleaved(calls, reps, WallClock()).items()}
    names, flush = list(calls), l2_flush(device)
    pending: dict[str, list] = {name: [] for name in names}
    for r in range(reps):
        torch.cuda._sleep(ROUND_SLEEP_CYCLES)
        for name in names[r % len(names):] + names[: r % len(names)]:
            flush()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            calls[name]()
            end.record()
            pending[name].append((start, end))
    torch.cuda.synchronize()
    return {name: [s.elapsed_time(e) for s, e in pairs] for name, pairs in pending.items()}
