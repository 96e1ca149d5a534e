"""The paper on a researcher's own GPU (python -m sarathi_lab.measure gpu --own): its dry run end to end in a fresh
interpreter, as a user starts it (progress lines, one folder of claims and figures, resume), and the
progress estimate, the unscaled plan and the refusals as unit tests."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sarathi_lab.analysis import registry
from sarathi_lab.harness import scales
from sarathi_lab.measure.gpu import state
from sarathi_lab.measure.gpu.own import StepProgress, clock
from sarathi_lab.measure.gpu.plan import STEPS, UNSCALED_STEPS, Step, format_plan, select
from sarathi_lab.measure.gpu.state import StepResult
from sarathi_lab.measure.gpu.steps.paper import job_overrides, sweep_dir

ROOT = Path(__file__).resolve().parents[1]
# Cheap in a dry run, and between them a sweep run in the worker's process (per_token_cost), figures that need
# two results' runs (per_token_cost reads tile_quantization's) and a result split into parts.
DRY_STEPS = ("env", "paper.per_token_cost", "paper.tile_quantization", "paper.capacity.strict")
LINE = re.compile(r"^\[own\] (\d+:\d\d:\d\d) elapsed, about (\d+:\d\d:\d\d) left \(\d+% of this run's work done\) "
                  r"\| (\S+): done in \d+ s \| (\d+) of (\d+) steps ended$", re.MULTILINE)


def command(*args: str, module: tuple[str, ...] = ("sarathi_lab.measure", "gpu"), out_env: Path | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "kernels")]))
    env.pop("OUT", None)
    if out_env is not None:
        env["OUT"] = str(out_env)
    return subprocess.run([sys.executable, "-m", *module, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.mark.e2e
def test_own_dry_run_ends_with_claims_and_figures_in_one_folder_and_resumes(tmp_path):
    out, exported = tmp_path / "paper_gpu", tmp_path / "OUT"
    run = command("--own", "--dry-run", "--out", str(out), "--steps", ",".join(DRY_STEPS), out_env=exported)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # A line as each job ends (a dry run's step is one job), each with the time since the start and left.
    lines = LINE.findall(run.stdout)
    assert [step for _, _, step, _, _ in lines] == list(DRY_STEPS), run.stdout
    assert [int(k) for *_, k, _ in lines] == [1, 2, 3, 4] and {n for *_, n in lines} == {"4"}
    assert lines[-1][1] == "0:00:00" and lines[0][1] != "0:00:00"
    # One folder: the claims table, its markdown and every figure the steps give; nothing in $OUT.
    claims = (out / "claims.csv").read_text()
    assert all(f"\n{name}," in claims for name in ("per_token_cost", "tile_quantization", "capacity"))
    figures = {p.stem for p in (out / "figures").glob("*.png")}
    assert {"per_token_cost", "tile_quantization", "capacity"} <= figures
    markdown = (out / "claims.md").read_text()
    assert "| experiment | claim |" in markdown
    assert all((out / link).is_file() for link in re.findall(r"!\[[^]]*\]\(([^)]+)\)", markdown))
    assert len(re.findall(r"!\[", markdown)) == len(figures)
    assert not exported.exists()
    assert f"results in {out}" in run.stdout and "claims.md" in run.stdout

    # The same command again runs nothing: no worker, no step rerun, the folder as it was.
    marks = {p: p.stat().st_mtime for p in [*out.glob("steps/*/DONE"), out / "claims.csv", out / "claims.md"]}
    again = command("--own", "--dry-run", "--out", str(out), "--steps", ",".join(DRY_STEPS))
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert f"{len(DRY_STEPS)} of {len(DRY_STEPS)} steps already finished" in again.stdout
    assert "starting" not in again.stdout and not LINE.search(again.stdout)
    assert {p: p.stat().st_mtime for p in marks} == marks


def test_own_refuses_a_budget_an_archive_docs_and_a_machine_without_a_gpu(tmp_path):
    run = command("--own", "--budget-min", "9", "--plan")
    assert run.returncode == 2 and "--budget-min is invalid with --own" in run.stderr
    run = command("--own", "--dry-run", "--out", str(ROOT / "docs" / "gpu" / "mine"), "--steps", "env")
    assert run.returncode == 2 and "never into docs/" in run.stderr
    assert not (ROOT / "docs" / "gpu" / "mine").exists()
    run = command("--own", "--steps", "env", "--out", str(tmp_path))
    if "is invalid here: torch sees no CUDA GPU" not in run.stderr:
        pytest.skip("a CUDA GPU is visible")
    assert run.returncode == 2 and not any(tmp_path.iterdir())


def test_produce_points_a_gpu_to_the_own_command():
    run = command("device=cuda", module=("sarathi_lab.produce",), timeout=120)
    assert run.returncode == 2 and "python -m sarathi_lab.measure gpu --own" in run.stderr


def test_own_plan_is_one_run_with_the_paper_s_settings():
    run = command("--own", "--plan")
    assert run.returncode == 0 and "call 1:" not in run.stdout
    total = sum(s.minutes for s in UNSCALED_STEPS)
    assert f"one run of about {total / 60:.1f} hours" in run.stdout
    assert "seq_len=1024,2048 " in run.stdout and "pd_ratio=2,5,10,14,20,28,50,100" in run.stdout
    assert format_plan(list(STEPS), 9.0) != format_plan(list(UNSCALED_STEPS), None)


def test_unscaled_sweeps_keep_the_lease_s_order_and_steps():
    # Every step the lease runs runs here too, under its name where the sweep is not split otherwise.
    lease = {s.name for s in STEPS if not (s.group == "paper" and registry.by_name(s.arg).gpu.unscaled)}
    assert lease <= {s.name for s in UNSCALED_STEPS}
    assert {s.arg for s in STEPS if s.group == "paper"} == {s.arg for s in UNSCALED_STEPS if s.group == "paper"}
    for result in (r for r in registry.RESULTS if r.gpu is not None and r.gpu.unscaled is not None):
        run, name = result.gpu.unscaled, result.name
        assert scales.overrides(name, "own") != scales.overrides(name, "gpu"), name
        assert run.minutes > result.gpu.minutes, name
        # Seeds first (slowest), the compared schedulers last (fastest), as the lease's.
        words = [o for p in (run.parts or [None]) for o in scales.overrides(name, "own", p.name if p else "")]
        seeds = {v for o in words if o.startswith("seed=") for v in o.split("=", 1)[1].split(",")}
        assert seeds == ({"0", "1", "2"} if result.name != "capacity" else set()), result.name
        swept = [o for o in scales.overrides(name, "own", run.parts[0].name if run.parts else "") if "," in o]
        # (decode_speedup compares the chunk's alignment; per_token_cost and chunk_overhead nothing)
        assert (swept[-1].startswith(("scheduler=", "scheduler.chunk_align="))
                or result.name in ("chunk_overhead", "per_token_cost")), result.name
        if run.parts:
            assert run.minutes == pytest.approx(sum(p.minutes for p in run.parts))
    assert [s.name for s in select("paper.scheduler_latency", unscaled=True)] == [
        f"paper.scheduler_latency.seed{i}" for i in range(3)]


def _job(folder: Path, overrides: list[str]) -> None:
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (folder / "metrics.json").write_text("{}")


def test_progress_counts_a_step_s_own_jobs_and_scales_what_is_left_by_what_ran(tmp_path):
    sweep = Step("paper.x", 10.0, "", "chunk_overhead", ("seed=0", "seq_len=1024", "chunk=64,128,256,512"))
    other = Step("paper.x.other", 5.0, "", "chunk_overhead", ("seed=1", "seq_len=1024", "chunk=64"))
    steps = [sweep, Step("env", 5.0, "")]
    jobs = [[o for o in job if not o.startswith("hydra.")] for job in job_overrides(sweep)]
    folder = sweep_dir(tmp_path, "chunk_overhead", dry_run=False)
    for i in range(2):  # finished before the run began (a resume)
        _job(folder / f"{i}", jobs[i])
    _job(folder / "9", [o for o in job_overrides(other)[0] if not o.startswith("hydra.")])  # another part's
    progress = StepProgress(tmp_path, steps, dry_run=False, started=1000.0)
    assert progress.poll(1001.0) == []
    # Before anything of this run finished: the plan's minutes of what is left, 2 of 4 jobs and env.
    assert progress.estimate(1001.0) == (0.0, 2 * 150 + 300)
    state.mark_started(tmp_path, "paper.x")
    _job(folder / "2", jobs[2])
    lines = progress.poll(1060.0)
    # One job (150 s of the plan) took 60 s: what is left, 150 + 300 s by the plan, at that rate.
    assert len(lines) == 1 and "paper.x: 3 of 4 jobs finished" in lines[0]
    assert f"about {clock(0.4 * 450)} left" in lines[0] and "0 of 2 steps ended" in lines[0]
    _job(folder / "3", jobs[3])
    state.write_result(tmp_path, StepResult("paper.x", "done", 1000.5, 100.0))
    state.write_result(tmp_path, StepResult("env", "failed", 1090.0, 1.0))
    lines = progress.poll(1120.0)
    assert ["4 of 4 jobs finished" in lines[0], "paper.x: done in 100 s" in lines[1]] == [True, True]
    # A step that failed leaves the plan: nothing is left.
    assert "env: failed in 1 s" in lines[2] and "about 0:00:00 left" in lines[2] and "2 of 2 steps ended" in lines[2]


def test_progress_says_the_running_step_after_a_quiet_while(tmp_path):
    progress = StepProgress(tmp_path, [Step("env", 1.0, "")], dry_run=False, started=time.time())
    state.mark_started(tmp_path, "env")
    assert progress.poll(progress.started + 60) == []
    (line,) = progress.poll(progress.started + 3600)
    assert line == ("[own] 1:00:00 elapsed, about 0:01:00 left (0% of this run's work done) | "
                    "env: 0 of 1 jobs finished, running | 0 of 1 steps ended")
