"""Engine times are differences of ``now()``; a virtual clock makes simulation exact, repeatable."""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable


class Clock(ABC):
    @abstractmethod
    def now(self) -> float:
        """Seconds since an arbitrary origin."""

    @abstractmethod
    def sleep_until(self, t: float) -> None:
        """Wait until ``now() >= t`` (no-op if it already is)."""


class WallClock(Clock):
    def __init__(self, synchronize: Callable[[], None] | None = None):
        # On CUDA torch.cuda.synchronize: queued GPU work counts where it ran.
        self._synchronize = synchronize

    def now(self) -> float:
        if self._synchronize is not None:
            self._synchronize()
        return time.perf_counter()

    def sleep_until(self, t: float) -> None:
        time.sleep(max(0.0, t - self.now()))


class CPUClock(Clock):
    """CPU seconds plus arrival waits: with one thread, the time as if it had its core alone."""

    def __init__(self) -> None:
        self._waited = 0.0

    def now(self) -> float:
        return time.process_time() + self._waited

    def sleep_until(self, t: float) -> None:
        self._waited += max(0.0, t - self.now())


class VirtualClock(Clock):
    def __init__(self) -> None:
        self._now = 0.0

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if not seconds >= 0:  # NaN too: a NaN time would stall every later reading
            raise ValueError(f"a virtual clock moves forward only; got {seconds!r} s")
        self._now += seconds

    def sleep_until(self, t: float) -> None:
        self._now = max(self._now, t)
