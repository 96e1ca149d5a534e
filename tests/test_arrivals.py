"""Arrival processes: gamma gaps with cv = 1 are Poisson's; cv sets the burstiness, not the rate."""
from __future__ import annotations

import math

import numpy as np
import pytest

from sarathi_lab.harness.arrivals import gamma_arrivals, poisson_arrivals

N = 40_000


def _gaps(times):
    return np.diff(times)


@pytest.mark.parametrize("qps", [0.5, 3.0, 40.0])
def test_gamma_with_cv_one_matches_poisson_in_mean_and_variance(qps):
    gamma = _gaps(gamma_arrivals(N, qps, 1.0, np.random.default_rng(1)))
    poisson = _gaps(poisson_arrivals(N, qps, np.random.default_rng(2)))
    mean, var = 1 / qps, 1 / qps**2  # exponential gaps
    # Five standard errors: the mean of n gaps has sd sqrt(var / n); the sample variance of an
    # exponential has sd about var * sqrt(8 / n) (its fourth central moment is 9 var^2).
    for gaps in (gamma, poisson):
        assert abs(gaps.mean() - mean) < 5 * math.sqrt(var / len(gaps))
        assert abs(gaps.var() - var) < 5 * var * math.sqrt(8 / len(gaps))


@pytest.mark.parametrize("cv", [0.25, 2.0, 4.0])
def test_cv_sets_the_spread_and_keeps_the_rate(cv):
    gaps = _gaps(gamma_arrivals(N, 2.0, cv, np.random.default_rng(3)))
    assert gaps.mean() == pytest.approx(0.5, rel=0.05 * cv)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


@pytest.mark.parametrize("kwargs, message", [
    ({"qps": float("nan"), "cv": 1.0}, "qps=nan is invalid"),
    ({"qps": 1.0, "cv": float("inf")}, "cv=inf is invalid"),
    ({"qps": 0.0, "cv": 1.0}, "qps=0.0 is invalid"),
])
def test_bad_rates_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        gamma_arrivals(10, rng=np.random.default_rng(0), **kwargs)


def test_same_seed_same_arrivals():
    a = gamma_arrivals(100, 3.0, 2.0, np.random.default_rng(7))
    assert a == gamma_arrivals(100, 3.0, 2.0, np.random.default_rng(7)) and a[0] == 0.0 and a == sorted(a)


@pytest.mark.parametrize("draw", [lambda n, rng: poisson_arrivals(n, 1.0, rng),
                                  lambda n, rng: gamma_arrivals(n, 1.0, 2.0, rng)])
def test_request_counts_at_the_edge(draw):
    # No requests, no arrivals (numpy refused a size of -1); a negative or fractional count is
    # refused with one line naming it (numpy's message named neither).
    assert draw(0, np.random.default_rng(0)) == []
    assert draw(1, np.random.default_rng(0)) == [0.0]
    for n in (-2, 2.5, True):
        with pytest.raises(ValueError, match=rf"^n={n!r} is invalid: must be an integer >= 0$"):
            draw(n, np.random.default_rng(0))
