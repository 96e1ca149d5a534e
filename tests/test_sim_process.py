"""bench sim_process: the trace it writes is sim_speed's, a run of it is timed as a child process, and
a folder that is no checkout is refused in one line."""
from __future__ import annotations

import csv

import pytest

from sarathi_lab.config import REPO_ROOT
from sarathi_lab.measure.sim_check import sim_process, sim_speed


def test_the_trace_file_holds_sim_speed_s_requests(tmp_path):
    path = sim_process.write_trace(tmp_path / "trace.csv", 50)
    rows = list(csv.DictReader(path.open()))
    prompts, decodes, arrivals = sim_speed.workload(50)
    assert [float(r["arrived_at"]) for r in rows] == arrivals  # to the last bit
    assert [int(r["num_prefill_tokens"]) for r in rows] == [len(p) for p in prompts]
    assert [int(r["num_decode_tokens"]) for r in rows] == decodes


def test_a_run_is_timed_as_a_child_and_gives_its_summary(tmp_path):
    trace = sim_process.write_trace(tmp_path / "trace.csv", 12)
    cpu_s, summary = sim_process.run_once(REPO_ROOT, trace, tmp_path / "run")
    assert cpu_s > 0 and summary["num_requests"] == 12 and summary["num_unfinished"] == 0


def test_a_folder_that_is_no_checkout_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        sim_process.main(["--against", str(tmp_path)])
    assert e.value.code == 2 and "--against=" in capsys.readouterr().err
