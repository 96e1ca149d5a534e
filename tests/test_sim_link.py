"""The measured link between two processes (sim/link.py): its fit, and a real ping-pong over gloo."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarathi_lab.sim import link


@settings(max_examples=50, deadline=None)
@given(latency_s=st.floats(1e-6, 1e-2), bandwidth=st.floats(1e7, 1e11))
def test_the_fit_recovers_a_link_s_latency_and_bandwidth(latency_s, bandwidth):
    sizes = list(link.SIZES)
    fitted = link.fit(sizes, [latency_s + n / bandwidth for n in sizes])
    assert fitted.latency_s == pytest.approx(latency_s, rel=1e-6, abs=1e-9)
    assert fitted.bandwidth == pytest.approx(bandwidth, rel=1e-6)
    assert fitted.message_s(1 << 20) == pytest.approx(latency_s + (1 << 20) / bandwidth, rel=1e-6)


def test_times_that_do_not_grow_with_the_size_are_refused():
    with pytest.raises(ValueError, match="do not grow"):
        link.fit([8, 1024], [1e-4, 1e-4])


def test_a_real_ping_pong_between_two_processes_measures_a_link():
    measured = link.measure(sizes=(8, 256 << 10), rounds=10)
    assert 0 <= measured.latency_s < 0.1 and measured.bandwidth > 1e6
    assert "GB/s" in measured.describe()
