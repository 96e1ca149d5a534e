"""Stop a run once its SLO verdict is certain, so an overloaded run's slowest part need not run."""
from __future__ import annotations

import math

from sarathi_lab.engine.llm_engine import LLMEngine
from sarathi_lab.engine.metrics import SLO


class SLOViolated(Exception):

    def __init__(self, constraint: str, message: str):
        super().__init__(message)
        self.constraint = constraint


def over_needed(total: int, percentile: float) -> int:
    """For numpy's linear percentile, the value at floor((total - 1) * p / 100) must be over."""
    return total - math.floor((total - 1) * percentile / 100)


class SLOGuard:
    """``total_gaps``: sum of max_new_tokens - 1 (exact when EOS is ignored)."""

    def __init__(self, slo: SLO, engine: LLMEngine, num_requests: int, total_gaps: int):
        self.slo, self.engine = slo, engine
        self.num_requests, self.total_gaps = num_requests, total_gaps
        self._late_needed, self._gaps_needed = (over_needed(num_requests, 50),
                                                over_needed(total_gaps, 99))
        # A check visits only undecided requests, and only when a cheap upper bound on the counts
        # could reach a verdict, so it stops at the same iteration.
        self._seen = 0
        self._iterations_seen = 0
        self._late = 0
        self._unscheduled: list = []  # records not yet scheduled, nor waited past the limit
        self._gaps_over = 0
        self._uncounted_gaps = 0  # an upper bound since the last visit
        self._active: list = []  # not finished, or gaps still to count
        self._counted: dict[int, int] = {}  # request -> token times counted

    def __call__(self, _record) -> None:
        engine, slo = self.engine, self.slo
        metrics = engine.metrics
        requests, iterations = metrics.requests, metrics.iterations
        if len(requests) > self._seen:
            new = requests[self._seen:]
            self._seen = len(requests)
            self._unscheduled += new
            self._active += new
        self._uncounted_gaps += sum(r.num_requests for r in iterations[self._iterations_seen:])
        self._iterations_seen = len(iterations)
        if (slo.sched_delay_p50_s is not None
                and self._late + len(self._unscheduled) >= self._late_needed):
            late = self._count_late(engine.elapsed(), slo.sched_delay_p50_s)
            if late >= self._late_needed:
                raise SLOViolated("sched_delay_p50_s",
                                  f"{late} of {self.num_requests} requests waited longer than "
                                  f"{slo.sched_delay_p50_s} s to be scheduled: the median cannot "
                                  f"come back under it")
        if slo.tbt_p99_s is not None and self.total_gaps > 0 \
                and self._gaps_over + self._uncounted_gaps + len(self._active) >= self._gaps_needed:
            ongoing = self._count_gaps(engine.elapsed(), slo.tbt_p99_s)
            over = self._gaps_over + ongoing
            if over >= self._gaps_needed:
                raise SLOViolated("tbt_p99_s", f"{over} of {self.total_gaps} token gaps exceed "
                                  f"{slo.tbt_p99_s} s: the P99 cannot come back under it")

    def _count_late(self, now: float, limit: float) -> int:
        undecided = []
        for r in self._unscheduled:
            delay = (r.first_scheduled if r.first_scheduled is not None else now) - r.arrival
            if delay > limit:
                self._late += 1
            elif r.first_scheduled is None:
                undecided.append(r)
        self._unscheduled = undecided
        return self._late

    def _count_gaps(self, now: float, limit: float) -> int:
        ongoing, still = 0, []
        counted = self._counted
        self._uncounted_gaps = 0
        for r in self._active:
            times = r.token_times
            seen = counted.get(r.request_id, 1)
            for k in range(seen, len(times)):
                self._gaps_over += times[k] - times[k - 1] > limit
            if len(times) > seen:
                counted[r.request_id] = len(times)
            if r.finish is None:
                still.append(r)
                ongoing += bool(times) and now - times[-1] > limit
        self._active = still
        return ongoing
