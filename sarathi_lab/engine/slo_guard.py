"""Stop a serving run as soon as its SLO verdict is certain. P99 TBT and the median scheduling delay
are percentiles over a count of values known in advance, and a value seen over its limit stays over
it (a waiting request's delay is at least its wait so far, a running one's gap at least the time
since its last token): once enough are over, the trial is decided and the rest of it, the slowest
part of an overloaded run, need not be served."""
from __future__ import annotations

import math

from sarathi_lab.engine.llm_engine import LLMEngine
from sarathi_lab.engine.metrics import SLO


class SLOViolated(Exception):
    """A run stopped early because it can no longer meet its SLO; the message names which and why."""

    def __init__(self, constraint: str, message: str):
        super().__init__(message)
        self.constraint = constraint


def over_needed(total: int, percentile: float) -> int:
    """How many of ``total`` values must exceed a limit for numpy's (linear) percentile to exceed
    it: the value at position floor((total - 1) * p / 100) of the sorted list must already be over."""
    return total - math.floor((total - 1) * percentile / 100)


class SLOGuard:
    """An ``on_iteration`` hook for ``engine``'s current run: raises SLOViolated once the run's P50
    scheduling delay or P99 TBT is certain to miss ``slo``. ``total_gaps`` is the number of
    time-between-token values the whole run produces (sum of max_new_tokens - 1; exact when EOS is
    ignored)."""

    def __init__(self, slo: SLO, engine: LLMEngine, num_requests: int, total_gaps: int):
        self.slo, self.engine = slo, engine
        self.num_requests, self.total_gaps = num_requests, total_gaps
        # The counts that decide each percentile, fixed for the run: checked at every iteration.
        self._late_needed, self._gaps_needed = over_needed(num_requests, 50), over_needed(total_gaps, 99)
        # A check visits only the requests whose verdict can still change (one over a limit is counted
        # once and dropped, as is one scheduled in time or finished with its gaps counted), and only
        # when a cheap upper bound on the counts (each undecided request may turn late, each request
        # an iteration ran may add a gap, each active one may be in a long gap now) could reach a
        # verdict: what a visit would count is still there later, so it stops at the same iteration.
        self._seen = 0  # records of the run's requests taken in so far
        self._iterations_seen = 0  # iteration records whose requests' gaps may be uncounted
        self._late = 0
        self._unscheduled: list = []  # records not yet scheduled, nor waited past the limit
        self._gaps_over = 0
        self._uncounted_gaps = 0  # at most this many gaps came since the last visit
        self._active: list = []  # records not finished, or finished with gaps still to count
        self._counted: dict[int, int] = {}  # request -> its token times whose gaps are counted

    def __call__(self, _record) -> None:
        engine, slo = self.engine, self.slo
        metrics = engine.metrics
        requests, iterations = metrics.requests, metrics.iterations
        if len(requests) > self._seen:
            new = requests[self._seen:]
            self._seen = len(requests)
            self._unscheduled += new
            self._active += new
        for record in iterations[self._iterations_seen:]:
            self._uncounted_gaps += record.num_prefill_requests + record.num_decode_requests
        self._iterations_seen = len(iterations)
        if slo.sched_delay_p50_s is not None and self._late + len(self._unscheduled) >= self._late_needed:
            late = self._count_late(engine.elapsed(), slo.sched_delay_p50_s)
            if late >= self._late_needed:
                raise SLOViolated("sched_delay_p50_s", f"{late} of {self.num_requests} requests waited longer than "
                                  f"{slo.sched_delay_p50_s} s to be scheduled: the median cannot come back under it")
        if slo.tbt_p99_s is not None and self.total_gaps > 0 \
                and self._gaps_over + self._uncounted_gaps + len(self._active) >= self._gaps_needed:
            ongoing = self._count_gaps(engine.elapsed(), slo.tbt_p99_s)
            over = self._gaps_over + ongoing
            if over >= self._gaps_needed:
                raise SLOViolated("tbt_p99_s", f"{over} of {self.total_gaps} token gaps exceed {slo.tbt_p99_s} s: "
                                  "the P99 cannot come back under it")

    def _count_late(self, now: float, limit: float) -> int:
        """Requests whose scheduling delay exceeds ``limit``, or will: a waiting one's delay is at
        least how long it has waited."""
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
        """Adds the new gaps over ``limit`` to the count; returns the running requests whose current
        gap (since their last token) is already over it."""
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
