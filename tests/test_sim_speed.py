"""The simulator's own speed command, started as users start it: it reports CPU seconds and, with
--profile, cProfile's table (no absolute time is asserted)."""
from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.e2e
def test_speed_command_reports_cpu_time_and_where_it_goes():
    done = subprocess.run([sys.executable, "-m", "sarathi_lab.bench.sim_speed", "--requests", "50", "--profile", "--top", "5"],
                          check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "50 requests (" in done.stdout and "s CPU" in done.stdout
    assert "tottime" in done.stdout
