"""The simulator's own speed command: it reports CPU seconds, requests/s and iterations/s and, with
--profile, cProfile's table (no absolute time is asserted: the machine may be shared)."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from sarathi_lab.measure.sim_check import sim_speed

LINE = re.compile(r"^(\d+) requests \((\d+) iterations, (\d+) s simulated\) in ([\d.]+) s CPU: "
                  r"([\d,]+|inf) requests/s, ([\d,]+|inf) iterations/s$", re.MULTILINE)


def test_speed_reports_requests_and_iterations_per_cpu_second(capsys):
    sim_speed.main(["--requests", "12", "--decode-tokens", "4-8", "--prompt-tokens", "100-600"])
    match = LINE.search(capsys.readouterr().out)
    assert match, "no speed line"
    requests, iterations, _, cpu_s = int(match[1]), int(match[2]), int(match[3]), float(match[4])
    assert requests == 12
    # Each decode token of a request is an iteration of its own (its first token ends its prefill).
    _, decodes, _ = sim_speed.workload(12, (100, 600), (4, 8))
    assert iterations >= max(decodes)
    if cpu_s > 0:
        assert float(match[5].replace(",", "")) == pytest.approx(requests / cpu_s, rel=0.02, abs=1)
        assert float(match[6].replace(",", "")) == pytest.approx(iterations / cpu_s, rel=0.02, abs=1)


def test_the_default_trace_is_the_one_the_simulator_is_held_to():
    prompts, decodes, arrivals = sim_speed.workload(500)
    assert {len(p) for p in prompts} == {1024} and set(decodes) == {256}
    assert arrivals == sorted(arrivals)
    assert 500 / arrivals[-1] == pytest.approx(sim_speed.ARRIVAL_RATE_RPS, rel=0.15)


@pytest.mark.e2e
def test_speed_command_reports_cpu_time_and_where_it_goes():
    done = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", "sim_speed", "--requests", "50",
                           "--profile", "--top", "5"], check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert LINE.search(done.stdout) and LINE.search(done.stdout)[1] == "50"
    assert "tottime" in done.stdout


def test_rate_sets_the_arrivals_and_the_digest_names_the_records():
    _, _, arrivals = sim_speed.workload(500, rate_rps=0.5)
    assert 500 / arrivals[-1] == pytest.approx(0.5, rel=0.15)
    runs = [sim_speed.simulate(8, scheduler="static", prompt_tokens=(100, 300), decode_tokens=(4, 8), rate_rps=rate,
                               with_digest=True) for rate in (0.5, 0.5, 50.0)]
    assert runs[0].digest == runs[1].digest and len(runs[0].digest) == 16
    assert runs[2].digest != runs[0].digest  # requests that overlap: other batches, other records
