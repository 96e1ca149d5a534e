"""The wing's one runner: ``python -m sarathi_lab.measure`` lists every registered measurement, a
line each, and runs a benchmark or a simulator check by name."""
from __future__ import annotations

import subprocess
import sys

from sarathi_lab.harness.tasks import task_names
from sarathi_lab.measure import __main__ as runner
from sarathi_lab.measure.bench.case import NAMES
from sarathi_lab.measure.gpu.plan import STEPS
from sarathi_lab.measure.sim_check import CHECKS


def test_the_listing_names_every_benchmark_check_gpu_step_and_task_within_the_width():
    lines = runner.listing().splitlines()
    named = [line.split()[0] for line in lines if line.startswith("  ")]
    every = [*NAMES, "all", *CHECKS, *(s.name for s in STEPS), *task_names()]
    assert sorted(named) == sorted(every)
    assert max(map(len, lines)) <= runner.WIDTH


def test_what_it_runs_by_name_has_one_name_each_and_an_unknown_one_is_refused():
    assert not set(NAMES) & set(CHECKS)
    done = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", "nope"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 2 and "measurement 'nope' is invalid" in done.stderr
