"""The GPU queue plans a paper step from its measured parts (measure/gpu/parts.py): the set-up its
process pays once and its jobs' seconds, read from the sweep's log and its runs' records, and shown
apart by --plan."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sarathi_lab.measure.gpu import parts, queue
from sarathi_lab.measure.gpu.parts import Job, StepParts
from sarathi_lab.measure.gpu.plan import BY_NAME, STEPS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "gpu"


def line(second: float, text: str) -> str:
    whole, frac = divmod(second, 1)
    return f"[2026-11-27 10:{int(whole) // 60:02d}:{int(whole) % 60:02d},{round(frac * 1000):03d}]{text}"


def log(*jobs: tuple[float, float, bool], launch_at: float = 5.0, end: float | None = None) -> str:
    """A sweep's log: the launch, then each job's (start, results time, ran)."""
    lines = ["a warning without a time", line(launch_at, "[HYDRA] Launching 3 jobs locally")]
    for num, (start, done, ran) in enumerate(jobs):
        lines.append(line(start, f"[HYDRA] \t#{num} : seed=0 chunk=64"))
        what = "results in /x/0_chunk=64: ok" if ran else "/x already holds this finished run; kept"
        lines.append(line(done, f"[sarathi_lab.harness.runner][INFO] - {what}"))
    if end is not None:
        lines.append(line(end, "[HYDRA] sweep /x: 3 jobs, 0 failed"))
    return "\n".join(lines)


def test_a_sweeps_log_gives_its_set_up_and_each_jobs_seconds():
    text = log((10, 12, True), (13, 13.5, False), (14, 20, True), end=21)
    spans, covered = parts.sweep_spans(text)
    assert spans == [(0, 3.0, True), (1, 1.0, False), (2, 7.0, True)] and covered == 11.0
    found = parts.step_parts("paper.x", "h100 lease", 30.0, text, {0: {"run_s": "1.5"}})
    assert found.setup_s == 19.0  # the step's 30 s less the 11 its jobs covered
    assert found.jobs[0].run_s == 1.5 and found.jobs[2].run_s is None
    # A resumed sweep's log holds each call's launch: the last is the step's seconds.
    again = log((1, 2, True)) + "\n" + log((40, 41, False), (42, 45, True), launch_at=39)
    assert parts.sweep_spans(again)[0] == [(0, 2.0, False), (1, 3.0, True)]
    assert parts.sweep_spans("no job started") is None


def test_an_estimate_takes_a_jobs_run_and_the_least_outside_it_and_graphs_once_a_set():
    jobs = (Job(0, 5.0, True, 1.0, 2.0, ""), Job(1, 4.0, True, 2.0, 1.0, ""), Job(2, 0.5, False),
            Job(3, 9.0, True, 3.0, None, ""))
    e = parts.estimate(StepParts("paper.x", "h100 L", 20.0, jobs), jobs=10, graph_sets=3)
    # Outside its run and captures: 2, 1, 6 s; the least, 1 s, is a job's and the set-up's one build.
    assert (e.setup_s, e.jobs, e.job_s, e.capture_s) == (21.0, 10, 2.0 + 1.0, 3 * 1.5)
    assert e.seconds == 21 + 30 + 4.5 and e.minutes(1.3) == round(1.3 * 55.5 / 60, 1)
    assert "its runs, one build" in e.source
    shared = tuple(j if j.run_s is None else Job(j.num, j.span_s, j.ran, j.run_s, j.capture_s, "reused")
                   for j in jobs)
    assert "on a shared engine" in parts.estimate(StepParts("paper.x", "h", 20.0, shared), 10, 3).source
    # Without the runs' seconds, each job is its whole span, builds included.
    untimed = parts.estimate(StepParts("paper.x", "h200 L", 7.0, (Job(0, 4.0, True), Job(1, 6.0, True))), 3, 2)
    assert (untimed.setup_s, untimed.job_s, untimed.capture_s) == (7.0, 5.0, 0.0)
    assert untimed.source.endswith(parts.AS_MEASURED)
    assert parts.estimate(StepParts("paper.x", "h", 1.0, (Job(0, 4.0, False),)), 3, 2) is None


def test_the_kept_leases_give_the_paper_steps_their_parts():
    found = {(p.where, p.step): p for p in queue.kept_parts(DOCS)}
    cut = found["h100 2026-11-27_7fae342", "paper.decode_speedup"]
    # The call stopped it: 45 jobs started, 44 finished; each finished one's run seconds beside the lease.
    assert len(cut.jobs) == 45 and sum(j.ran for j in cut.jobs) == 44
    assert all(j.run_s is not None for j in cut.jobs if j.ran) and 0 < cut.setup_s < 232
    eager = found["h100 2026-11-26_27958ff", "paper.orca_compare"]
    assert all(j.run_s is None for j in eager.jobs)  # no run folders kept: jobs as measured


@pytest.mark.parametrize("name, launched", [("paper.orca_compare", 12), ("paper.pd_ratio", 18),
                                            ("paper.decode_speedup", 24), ("paper.chunk_batch", 15),
                                            ("paper.capacity.strict", 2)])
def test_a_steps_jobs_are_those_its_sweep_launches(name, launched):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from sarathi_lab.harness import CONF_DIR, scales
    from sarathi_lab.harness.sweep_check import collapse_ignored, without_excluded

    step = BY_NAME[name]
    jobs = queue.launched_jobs(step)
    assert len(jobs) == launched
    # The sweeper's own exclusion and collapse, on every job composed, are the reference.
    exclude = [o for o in step.overrides if o.startswith(scales.EXCLUDE + "=")]
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", [f"experiment={step.arg}", *exclude], return_hydra_config=True)
        kept, _ = without_excluded(cfg.hydra.sweeper.exclude,
                                   [list(job) for job in queue.job_overrides(step)])
        if not OmegaConf.select(cfg, "hydra.sweeper.repeat_ignored"):
            kept, _ = collapse_ignored(cfg, kept)
    assert sorted(map(tuple, kept)) == sorted(jobs)


def test_plan_shows_each_paper_steps_set_up_and_jobs_apart():
    done = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", "gpu", "--plan"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=True)
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("paper.")}
    assert "set-up" in done.stdout.splitlines()[0] and "jobs" in done.stdout.splitlines()[0]
    assert " 24 x " in rows["paper.decode_speedup"] and " 12 x " in rows["paper.orca_compare"]
    assert "paper steps: " in done.stdout and "set-up under 10% of each paper step" in done.stdout
    planned = queue.plan_steps(queue.kept_runs(DOCS), kept_parts=queue.kept_parts(DOCS))
    speedup = planned["paper.decode_speedup"]
    assert speedup.source.startswith("measured parts: set-up ") and speedup.estimate.jobs == 24
    # Run after per_token_cost in one process: its own sweep's set-up, not a process's.
    steps, grouped = queue.measured(list(STEPS), DOCS)
    shown = {s.name: s for s in steps}["paper.decode_speedup"]
    assert grouped["paper.decode_speedup"].process_s == 0 and shown.minutes < speedup.minutes
    assert f"{shown.minutes:5.1f}" in rows["paper.decode_speedup"]
    assert "process: llama-13b bfloat16 cuda, one process for 7 paper steps" in done.stdout
    assert planned["paper.capacity.strict"].estimate.source == "planned"


def test_a_paper_step_writes_its_jobs_parts(tmp_path):
    sweep = tmp_path / "sweep"
    for job, record in {"0_seed=0": {"wall_time_s": 1.25, "environment": {
            "cuda_graphs": {"capture_s": 0.5, "kept": False},
            "engine_setup": {"seconds": 2.0, "parts": {"model": "built"}}}},
            "1_seed=1": {"wall_time_s": 1.0, "environment": {
                "cuda_graphs": {"capture_s": 0.5, "kept": True},
                "engine_setup": {"seconds": 0.1, "parts": {"model": "re-seeded"}}}},
            "2_seed=2": None}.items():
        (sweep / job).mkdir(parents=True)
        if record:
            (sweep / job / "metrics.json").write_text(json.dumps(record))
    rows = parts.sweep_rows("paper.x", sweep, ["0_seed=0", "1_seed=1", "2_seed=2"])
    parts.write_rows(tmp_path / "jobs.csv", rows)
    read = parts.read_rows(tmp_path / "jobs.csv")["paper.x"]
    assert sorted(read) == [0, 1]
    assert read[0]["capture_s"] == "0.5" and read[1]["capture_s"] == ""  # the kept set captured nothing
    assert read[1]["engine"] == "re-seeded" and read[0]["run_s"] == "1.25"
