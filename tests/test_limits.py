"""Limits refused by arithmetic before any work, in one line naming the key: threads beyond the cores
this process may run on, a run name that would leave outputs/, arrivals past the horizon a run may
span, trace fields past the csv module's limit, sweeps beyond a job count or with repeated jobs; and
``generate`` entered twice on one LLM refused in one line rather than failing deep inside."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sarathi_lab import LLM
from sarathi_lab.config import ConfigError
from sarathi_lab.harness.cli_check import check_command_line, compose_config
from sarathi_lab.harness.preflight import preflight
from sarathi_lab.harness.schema import WorkloadCfg, parse_config
from sarathi_lab.harness.sweep_check import MAX_SWEEP_JOBS, too_many_or_repeated
from sarathi_lab.harness.workloads import build_workload, read_trace
from sarathi_lab.inputs import ARRIVAL_HORIZON_S

CORES = len(os.sched_getaffinity(0))


@pytest.mark.parametrize("threads", [CORES + 1, 64, 10**6])
def test_more_threads_than_cores_is_refused_naming_the_runs_key(threads):
    if threads <= CORES:
        pytest.skip("this machine has that many cores")
    with pytest.raises(ConfigError, match=rf"^device.num_threads={threads} is invalid: this process may run on "
                                          rf"{CORES} cores, so at most {CORES}$"):
        preflight(parse_config(compose_config([f"device.num_threads={threads}"])))
    with pytest.raises(ConfigError, match=rf"^num_threads={threads} is invalid"):
        LLM("tiny", num_threads=threads)


@pytest.mark.parametrize("value", ["../../../escaped", "a/b", "..", ".", "ok,../x"])
def test_a_name_that_leaves_outputs_is_refused(value):
    args = (["-m"] if "," in value else []) + [f"name={value}"]
    error = check_command_line(args)
    assert error and error.startswith("name=") and "plain folder name" in error, error


def test_a_plain_name_passes():
    assert check_command_line(["name=my-run_2"]) is None


def test_arrivals_past_the_horizon_are_refused():
    with pytest.raises(ConfigError, match=r"^workload.qps=1e-09 is invalid: 4 requests at that rate arrive over"):
        build_workload(WorkloadCfg(kind="synthetic", num_requests=4, arrival="poisson", qps=1e-9), 64, 3, 0, 100)
    llm = LLM("tiny", warmup_iters=0)
    with pytest.raises(ValueError, match=r"^arrival_times\[1\]=1000000000.0 is invalid: must be in \[0, 86400\]"):
        llm.generate([[1, 2], [3, 4]], max_new_tokens=2, arrival_times=[0.0, 1e9])
    assert llm.generate([[1, 2]], max_new_tokens=2, arrival_times=[0.0]) and ARRIVAL_HORIZON_S == 86_400


def test_a_trace_past_the_horizon_or_with_a_huge_field_is_refused_naming_it(tmp_path):
    late = tmp_path / "late.csv"
    late.write_text(f"arrived_at,num_prefill_tokens,num_decode_tokens\n0,4,4\n{ARRIVAL_HORIZON_S * 2},4,4\n")
    with pytest.raises(ConfigError, match=rf"^workload.path='{late}' is invalid: its arrivals span 1.73e\+05 s"):
        read_trace(WorkloadCfg(kind="trace", num_requests=None, qps=None, path=str(late)))
    huge = tmp_path / "huge.csv"
    huge.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,4," + "7" * 10_000_000 + "\n")
    with pytest.raises(ConfigError, match=rf"^workload.path='{huge}' is invalid: not a readable CSV"):
        read_trace(WorkloadCfg(kind="trace", num_requests=None, qps=None, path=str(huge)))


def test_sweeps_too_large_or_repeating_a_job_are_refused():
    assert too_many_or_repeated([[f"seed={i}"] for i in range(MAX_SWEEP_JOBS)]) is None
    assert "1001 jobs, more than the 1000" in too_many_or_repeated([[f"seed={i}"] for i in range(MAX_SWEEP_JOBS + 1)])
    assert too_many_or_repeated([["chunk=256", "seed=0"], ["chunk=512", "seed=0"], ["seed=0", "chunk=256"]]) \
        .startswith("sweep jobs 0 and 2 are the same")


@pytest.mark.parametrize("sweep, said", [("chunk=256,256", "sweep jobs 0 and 1 are the same"),
                                         ("seed=range(0,1001)", "the sweep has 1001 jobs")])
def test_a_refused_sweep_starts_no_job_and_says_why_in_one_line(sweep, said, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    done = subprocess.run([sys.executable, "-m", "sarathi_lab.run", "-m", sweep, "logger=none", "executor=sim"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and said in lines[0], lines
    assert not list(Path(tmp_path).rglob("status.json"))


def test_generate_entered_twice_on_one_llm_is_refused_in_one_line():
    # The first call holds in its callback while a second thread calls generate on the same LLM: that
    # interleaving failed with KeyError: 5 inside the engine.
    llm = LLM("tiny", warmup_iters=0)
    inside, done = threading.Event(), threading.Event()
    errors = []

    def hold(record):
        inside.set()
        done.wait(30)

    def second():
        inside.wait(30)
        try:
            llm.generate([[1, 2, 3]], max_new_tokens=2)
        except RuntimeError as e:
            errors.append(str(e))
        finally:
            done.set()

    t = threading.Thread(target=second)
    t.start()
    first = llm.generate([[4, 5, 6]], max_new_tokens=3, on_iteration=hold)
    t.join()
    assert len(first[0]) == 3
    assert len(errors) == 1 and errors[0].startswith("LLM.generate is already running on this LLM") \
        and "\n" not in errors[0]
    assert len(llm.generate([[1, 2, 3]], max_new_tokens=2)[0]) == 2  # free again afterwards
