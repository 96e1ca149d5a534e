"""A long sweep says how long it will take (from earlier jobs on this machine) and how to resume it:
the estimate, the progress line, the resume command and the offer to resume an unfinished sweep."""
from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys

import pytest
import yaml

from sarathi_lab.harness import REPO_ROOT, sweep_eta, sweep_resume, sweep_sim_eta
from sarathi_lab.harness.sweep_eta import Job, SweepClock, duration, estimate, past_jobs, record
from sarathi_lab.harness.sweep_state import SweepState

KIND = "cpu-small|model|serve|cpu"


def _past(overrides, seconds, tokens=1000, kind=KIND):
    return {"overrides": sorted(overrides), "kind": kind, "tokens": tokens, "seconds": seconds,
            "host": platform.node()}


def test_a_job_timed_before_is_expected_to_take_as_long_again():
    past = [_past(["chunk=64"], 100.0), _past(["chunk=64"], 120.0), _past(["chunk=64"], 110.0)]
    assert estimate(Job(("chunk=64",), KIND, 1000), past) == sweep_eta.Estimate(110.0, "timed")


def test_a_new_job_is_scaled_by_tokens_from_similar_jobs_only():
    past = [_past(["chunk=64"], 100.0, tokens=1000), _past(["x=1"], 999.0, tokens=10, kind="tiny|sim|serve|cpu")]
    assert estimate(Job(("chunk=128",), KIND, 3000), past) == sweep_eta.Estimate(300.0, "scaled")
    assert estimate(Job(("chunk=128",), "llama|model|serve|cuda", 3000), past).seconds is None
    assert estimate(Job(("chunk=64",), KIND, 1000, kept=True), past).seconds == 0.0


def test_over_an_hour_is_said_before_the_first_job():
    past = [_past([f"pd_ratio={p}"], 900.0) for p in (4, 8, 16, 32, 64)]
    clock = SweepClock([Job((f"pd_ratio={p}",), KIND, 1000) for p in (4, 8, 16, 32, 64)], past)
    first, long = clock.before()
    assert "5 jobs, expected to take about 1h15m on this machine" in first and "5 as timed before" in first
    assert "over an hour" in long and "Ctrl-C" in long and "resume" in long
    assert len(SweepClock([Job(("pd_ratio=4",), KIND, 1000)], past).before()) == 1, "15 minutes: no warning"


def test_a_sweep_with_no_past_says_the_progress_will_tell_and_then_it_does():
    clock = SweepClock([Job((f"chunk={c}",), KIND, 1000 * (i + 1)) for i, c in enumerate((16, 32, 64))], [])
    (line,) = clock.before()
    assert "no earlier job" in line
    # The first job took an hour: the others, twice and three times its tokens, take 5 h more.
    progress = clock.job_ended(0, 3600.0)
    assert progress.startswith("sweep: 1 of 3 jobs done") and "about 5h00m left (ETA" in progress
    assert "over an hour" in progress, "the first job told what no estimate did"


def test_the_engine_s_set_up_is_counted_once_not_scaled_to_the_jobs_that_reuse_it():
    # As a sweep's jobs share one engine: the first job built it (4 s of its 8 s), the others reuse it.
    clock = SweepClock([Job((f"chunk={c}",), KIND, 1000) for c in (256, 512, 1024)], [])
    assert "about 8s left" in clock.job_ended(0, 8.0, setup_s=4.0), "4 s a job, not 8"
    # Later sweeps: each past job counted without its set-up, and one set-up added per kind of job.
    past = [_past(["a=1"], 10.0) | {"setup_s": 4.0}, _past(["a=2"], 6.0) | {"setup_s": 0.0},
            _past(["a=3"], 6.0)]
    (line,) = SweepClock([Job((f"a={i}",), KIND, 1000) for i in (1, 2, 3)], past).before()
    assert "expected to take about 22s" in line, line  # 6 + 6 + 6 + one 4 s set-up
    fresh = SweepClock([Job(("a=4",), "other|model|serve|cpu", 1000)], past)
    assert fresh.setups == {"other|model|serve|cpu": 0.0}, "no set-up known for a kind never built"


def test_the_remaining_estimates_follow_how_the_ended_jobs_compared():
    past = [_past(["a=1"], 10.0), _past(["a=2"], 10.0), _past(["a=3"], 10.0)]
    clock = SweepClock([Job((f"a={i}",), KIND, 1000) for i in (1, 2, 3)], past)
    assert "about 20s left" in clock.job_ended(0, 10.0)
    assert "about 20s left" in clock.job_ended(1, 30.0), "twice as slow as estimated: 10 s -> 20 s"
    assert clock.job_ended(2, 20.0).endswith("3 of 3 jobs done in 0s")


def test_a_first_sweep_on_a_machine_is_estimated_on_the_simulator_then_scaled_by_its_first_job():
    jobs = [Job((f"chunk={c}",), KIND, 1000, simulated_s=s) for c, s in ((16, 10.0), (32, 20.0), (64, 30.0))]
    (line,) = SweepClock(jobs, []).before()
    assert line.startswith("sweep: 3 jobs, expected to take at least 1m on this machine, from the simulator "
                           "(3 served on the simulator at this CPU's measured ceilings, a floor"), line
    # The first job took four times its floor: the others are expected to take four times theirs.
    assert "about 3m left" in SweepClock(jobs, []).job_ended(0, 40.0)
    # A job timed before is expected to take its time again, whatever the simulator said.
    timed = estimate(Job(("chunk=16",), KIND, 1000, simulated_s=10.0), [_past(["chunk=16"], 99.0)])
    assert timed == sweep_eta.Estimate(99.0, "timed")


def test_a_first_sweep_without_the_cpu_s_ceilings_says_how_to_get_the_simulator_s_estimate(monkeypatch, tmp_path):
    from sarathi_lab.harness.cli_check import compose_config
    from sarathi_lab.harness.schema import parse_config
    from sarathi_lab.sim.device import CEILINGS_ENV, MEASURE_COMMAND

    monkeypatch.setenv(CEILINGS_ENV, str(tmp_path / "none.json"))
    cfg = parse_config(compose_config(["experiment=smoke"]))
    jobs = [sweep_eta.job(["chunk=16"], cfg)]
    kept, why = sweep_sim_eta.simulated(None, [["chunk=16"]], jobs, [cfg], [])
    assert kept == jobs and MEASURE_COMMAND in why
    (line,) = SweepClock(kept, [], why).before()
    assert "no earlier job on this machine to estimate their time from (the simulator's estimate needs this " \
           f"CPU's ceilings, not measured here: {MEASURE_COMMAND})" in line


@pytest.mark.e2e
def test_a_first_sweep_says_the_simulator_s_estimate_before_its_first_job(tmp_path):
    # The tests' synthetic ceilings (conftest.py) stand for a machine's measured ones.
    proc = subprocess.run([sys.executable, "-m", "sarathi_lab.run", "-m", "experiment=smoke", "chunk=32,64",
                           "workload.num_requests=2", "seq_len=48", "pd_ratio=5", "logger=none",
                           f"hydra.sweep.dir={tmp_path}/sweep"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False, env=os.environ | {"PYTHONPATH": str(REPO_ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    said = next(line for line in out.splitlines() if "sweep: 2 jobs" in line)
    assert "expected to take at least" in said and "from the simulator (2 served on the simulator" in said, said
    assert out.index("sweep: 2 jobs") < out.index("#0 :"), "before the first job"


def test_times_are_kept_per_sweep_and_read_for_this_machine_only(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    record(a, Job(("chunk=64",), KIND, 10), 5.0)
    (b / sweep_eta.JOB_TIMES).write_text('{"overrides": [], "host": "elsewhere", "seconds": 1}\n{"cut')
    (found,) = past_jobs(b)
    assert found["overrides"] == ["chunk=64"] and found["seconds"] == 5.0


@pytest.mark.parametrize("seconds, text", [(5, "5s"), (125, "2m"), (3600 * 2 + 60 * 7, "2h07m")])
def test_durations_read_as_people_say_them(seconds, text):
    assert duration(seconds) == text


def test_the_resume_command_is_the_same_command_into_the_sweep_dir(monkeypatch):
    monkeypatch.setattr(sweep_resume, "_typed", ["-m", "experiment=smoke", "tags=[a, b]", "hydra.sweep.dir=old"])
    monkeypatch.setattr(sweep_resume, "_resume", None)
    assert sweep_resume.resume_line() is None
    config = type("C", (), {"hydra": type("H", (), {"sweep": type("S", (), {"dir": "outputs/x/multiruns/t1"})})})
    sweep_resume.sweep_started(config)
    command = sweep_resume.resume_line().split(": ", 1)[1]
    assert shlex.split(command) == ["python", "-m", "sarathi_lab.run", "-m", "experiment=smoke", "tags=[a, b]",
                                    "hydra.sweep.dir=outputs/x/multiruns/t1"]


def _launched(parent, name, task, finished=1):
    sweep = parent / name
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text(yaml.safe_dump(
        {"hydra": {"overrides": {"task": task, "hydra": ["hydra.mode=MULTIRUN"]}}}))
    for num, chunk in enumerate((16, 32)):
        job = sweep / f"{num}_chunk={chunk}"
        job.mkdir()
        (job / "status.json").write_text('{"status": "interrupted", "time": 1}')
        if num < finished:
            (job / "metrics.json").write_text("{}")
    return sweep


def test_the_newest_unfinished_sweep_of_the_same_command_is_found(tmp_path):
    parent = tmp_path / "multiruns"
    older = _launched(parent, "t1", ["chunk=16,32", "experiment=smoke"])
    _launched(parent, "t2", ["chunk=16,64", "experiment=smoke"])     # another command
    _launched(parent, "t3", ["chunk=16,32", "experiment=smoke"], finished=0)  # stopped in its first job
    found = sweep_resume.unfinished_sweep(["experiment=smoke", "chunk=16,32", "on_existing=skip"], parent / "t9")
    assert found is not None and found[0] == older and found[1].describe().startswith("1 of 2 jobs finished")
    assert sweep_resume.unfinished_sweep(["experiment=smoke", "chunk=16,128"], parent / "t9") is None
    _launched(parent, "t4", ["chunk=16,32", "experiment=smoke"], finished=2)
    assert sweep_resume.unfinished_sweep(["experiment=smoke", "chunk=16,32"], parent / "t9") is None, \
        "the newest sweep of the command is complete: a rerun starts a new one"


def test_the_offer_resumes_under_skip_asks_on_a_terminal_and_else_says_how(tmp_path, capsys):
    state = SweepState(("0_a",), (), 2, False)
    args = ["-m", "chunk=16,32"]
    resumed = [*args, f"hydra.sweep.dir={tmp_path}"]
    assert sweep_resume.offer(args, tmp_path, state, skip=True) == resumed
    assert sweep_resume.offer(args, tmp_path, state, skip=False, ask=lambda q: "") == resumed
    assert sweep_resume.offer(args, tmp_path, state, skip=False, ask=lambda q: "n") == args
    assert sweep_resume.offer(args, tmp_path, state, skip=False) == args  # no terminal here
    said = capsys.readouterr().err
    assert "resuming it there (on_existing=skip)" in said
    assert f"To resume that one instead: python -m sarathi_lab.run -m chunk=16,32 hydra.sweep.dir={tmp_path}" in said
