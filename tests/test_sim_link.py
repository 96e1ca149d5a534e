"""The link between two processes: its table (sim/link.py), and a real ping-pong over gloo
(measure/profiling/link.py)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarathi_lab.measure.profiling.link import measure
from sarathi_lab.sim.link import Link


def test_a_message_s_time_is_read_off_the_table_linear_between_sizes_and_on_the_last_slope_beyond():
    link = Link((8, 1024, 65536), (1e-4, 2e-4, 2e-3))
    assert link.message_s(8) == pytest.approx(1e-4) and link.message_s(65536) == pytest.approx(2e-3)
    assert link.message_s(516) == pytest.approx(1.5e-4)
    assert link.message_s(65536 + 64512) == pytest.approx(2e-3 + 1.8e-3)
    # A table whose largest size is no slower than the one before stays flat beyond it.
    assert Link((8, 1024), (2e-3, 1e-3)).message_s(1 << 20) == pytest.approx(1e-3)


@settings(max_examples=50, deadline=None)
@given(latency_s=st.floats(1e-6, 1e-2), bandwidth=st.floats(1e7, 1e11), nbytes=st.integers(0, 1 << 24))
def test_a_linear_link_is_latency_plus_bytes_over_bandwidth(latency_s, bandwidth, nbytes):
    assert Link.linear(latency_s, bandwidth).message_s(nbytes) == pytest.approx(latency_s + nbytes / bandwidth)


def test_a_table_without_two_increasing_sizes_is_refused():
    for sizes, seconds in (((8,), (1e-4,)), ((8, 8), (1e-4, 1e-4)), ((64, 8), (1e-4, 1e-4)), ((8, 64), (1e-4,))):
        with pytest.raises(ValueError, match="two or more increasing sizes"):
            Link(sizes, seconds)


def test_a_real_ping_pong_between_two_processes_measures_every_size():
    link = measure(sizes=(8, 256 << 10), rounds=10)
    assert link.sizes == (8, 256 << 10) and all(0 < s < 1 for s in link.seconds)
    first, last = (f"{s * 1e6:.0f}" for s in link.seconds)
    assert link.describe() == f"{first} us (8 B) to {last} us (0.25 MiB) a message"


def test_a_ping_pong_that_gives_no_times_fails_in_one_line_naming_why():
    with pytest.raises(RuntimeError, match="gave no times within 3 s"):
        measure(sizes=(), rounds=1, timeout_s=3)   # each process fails before its first round


def test_the_command_line_refuses_cores_it_may_not_run_on(capsys):
    from sarathi_lab.measure.profiling.link import main

    with pytest.raises(SystemExit) as done:
        main(["--cores", "0,9999"])
    assert done.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --cores=0,9999 is invalid: must be two cores")
