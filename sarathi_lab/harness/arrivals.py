"""Arrival times of a serving run: Poisson, or gamma gaps of mean 1 / qps whose coefficient of
variation is cv (shape 1 / cv^2; 1: Poisson, > 1: burstier, < 1: more regular)."""
from __future__ import annotations

import math

import numpy as np

from sarathi_lab.config import AS_WRITTEN, check_count


def _check(n: int, qps: float) -> None:
    check_count("n", n, 0, AS_WRITTEN)
    if not (math.isfinite(qps) and qps > 0):
        raise ValueError(f"qps={qps!r} is invalid: must be a finite number > 0")


def gamma_arrivals(n: int, qps: float, cv: float, rng: np.random.Generator) -> list[float]:
    """n arrival times starting at 0, gaps ~ Gamma(shape 1/cv^2, mean 1/qps)."""
    _check(n, qps)
    if not (math.isfinite(cv) and cv > 0):
        raise ValueError(f"cv={cv!r} is invalid: must be a finite number > 0")
    if n == 0:
        return []
    shape = 1.0 / cv**2
    gaps = rng.gamma(shape, 1.0 / (qps * shape), size=n - 1)
    return [0.0, *np.cumsum(gaps).tolist()]


def poisson_arrivals(n: int, qps: float, rng: np.random.Generator) -> list[float]:
    """Exponential gaps (a Poisson process) of mean 1 / qps."""
    _check(n, qps)
    if n == 0:
        return []
    return [0.0, *np.cumsum(rng.exponential(1.0 / qps, size=n - 1)).tolist()]
