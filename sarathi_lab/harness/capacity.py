"""Capacity under latency SLOs (Sarathi-Serve) by a bracketing search, passing assumed monotone in
the rate as the papers do; a trial stops once its verdict is certain, so overload is cheap."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from sarathi_lab.engine.metrics import SLO
from sarathi_lab.harness.schema import CapacityCfg


@dataclass(frozen=True)
class Trial:
    rate_rps: float
    passed: bool
    binding: str | None          # the constraint it missed
    stopped_early: bool
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Capacity:
    capacity_rps: float | None   # None: even the lowest failed
    lowest_failing_rps: float | None  # None: every rate tried passed
    requested_resolution: float
    binding: str | None          # what failed at the lowest failing rate
    trials: list[Trial]

    @property
    def bounded(self) -> bool:
        """False: every rate up to max_qps passed, so capacity >= capacity_rps."""
        return self.lowest_failing_rps is not None

    @property
    def resolution(self) -> float | None:
        """As reached (wider when the trials ran out first); None where no two rates bracket it."""
        if self.capacity_rps is None or self.lowest_failing_rps is None:
            return None
        return self.lowest_failing_rps / self.capacity_rps - 1

    @property
    def resolved(self) -> bool:
        return self.bounded and self.capacity_rps is not None and \
            self.lowest_failing_rps <= self.capacity_rps * (1 + self.requested_resolution)

    def describe(self) -> str:
        """To the digits its bracket resolves."""
        tried = f"after {len(self.trials)} trials"
        if self.capacity_rps is None:
            return (f"capacity below {_rounded(self.lowest_failing_rps, None)} req/s: even the "
                    f"lowest rate tried failed (binding: {self.binding}) {tried}")
        if not self.bounded:
            return (f"capacity >= {_rounded(self.capacity_rps, None)} req/s: every rate tried "
                    f"passed, so this is a lower bound, not a capacity {tried}")
        low = _rounded(self.capacity_rps, self.resolution)
        high = _rounded(self.lowest_failing_rps, self.resolution)
        return f"capacity {low} req/s (fails by {high} req/s; binding: {self.binding}) {tried}"

    def as_dict(self) -> dict[str, Any]:
        return {"capacity_rps": self.capacity_rps, "resolution": self.resolution,
                "requested_resolution": self.requested_resolution, "resolved": self.resolved,
                "lowest_failing_rps": self.lowest_failing_rps, "binding": self.binding,
                "bounded": self.bounded,
                "trials": [{k: v for k, v in asdict(t).items() if k != "summary"}
                           for t in self.trials]}


def _rounded(qps: float, resolution: float | None) -> str:
    digits = (3 if resolution is None or resolution <= 0
              else max(2, math.ceil(-math.log10(resolution)) + 1))
    return f"{float(f'{qps:.{digits}g}'):g}"  # 113.1 -> 110, not 1.1e+02


def verdict(summary: dict[str, Any], slo: SLO, require_stable: bool = True) -> str | None:
    """The first SLO constraint missed, or None; ``require_stable``: a growing queue fails too."""
    delay = slo.sched_delay_p50_s
    if delay is not None and not summary["sched_delay_p50_s"] <= delay:
        return "sched_delay_p50_s"
    if slo.tbt_p99_s is not None and not summary["itl_p99_s"] <= slo.tbt_p99_s:
        # NaN (no token gaps at all) fails too: a run that produced no second token met nothing.
        return "tbt_p99_s"
    if require_stable and summary.get("saturated"):
        return "saturated"
    return None


def search_capacity(run_trial: Callable[[float], Trial], search: CapacityCfg) -> Capacity:
    trials: list[Trial] = []
    best: Trial | None = None
    worst: Trial | None = None

    def trial(qps: float) -> Trial:
        nonlocal best, worst
        t = run_trial(qps)
        trials.append(t)
        if t.passed and (best is None or qps > best.rate_rps):
            best = t
        if not t.passed and (worst is None or qps < worst.rate_rps):
            worst = t
        return t

    qps = search.start_qps
    step = 2.0 if trial(qps).passed else 0.5
    while (worst is None or best is None) and len(trials) < search.max_trials:
        # A step past a bound tries the bound itself, once: the capacity may lie between.
        following = min(max(qps * step, search.min_qps), search.max_qps)
        if following == qps:
            break
        qps = following
        trial(qps)
    while best is not None and worst is not None \
            and worst.rate_rps > best.rate_rps * (1 + search.resolution) \
            and len(trials) < search.max_trials:
        # Geometric middle: the resolution is relative.
        trial(math.sqrt(best.rate_rps * worst.rate_rps))
    return Capacity(capacity_rps=best.rate_rps if best else None,
                    lowest_failing_rps=worst.rate_rps if worst else None,
                    requested_resolution=search.resolution,
                    binding=worst.binding if worst else None, trials=trials)


def serve_trial(llm, prompts: list[list[int]], decode_lens: list[int], arrivals: list[float],
                slo: SLO, qps: float, require_stable: bool = True,
                max_concurrency: int | None = None) -> Trial:
    from sarathi_lab.engine.sequence import SamplingParams
    from sarathi_lab.engine.slo_guard import SLOGuard, SLOViolated

    guard = SLOGuard(slo, llm.engine, len(prompts), sum(d - 1 for d in decode_lens))
    try:
        llm.generate(prompts, max_new_tokens=decode_lens, arrival_times=arrivals,
                     sampling=SamplingParams(ignore_eos=True), on_iteration=guard,
                     max_concurrency=max_concurrency)
    except SLOViolated as stop:
        return Trial(qps, passed=False, binding=stop.constraint, stopped_early=True,
                     summary=llm.metrics.summary(slo) | {"stopped_early_because": str(stop)})
    summary = llm.metrics.summary(slo)
    binding = verdict(summary, slo, require_stable)
    return Trial(qps, passed=binding is None, binding=binding, stopped_early=False, summary=summary)
