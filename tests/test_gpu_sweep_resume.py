"""A paper sweep cut by a GPU call's end resumes in the next call at the same engine code, as the
H100 lease's decode_speedup must (44 of its 72 jobs in one call): the call's archive brings the
finished jobs back, the queue sizes the next call by the jobs left, and the step run again keeps
every finished job byte for byte and runs only the others. A real sweep (pd_ratio at the CI scale,
simulated) stands in for the GPU's, through the suite's own paper step."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from sarathi_lab.harness import scales
from sarathi_lab.measure.gpu import engine_code, queue, state
from sarathi_lab.measure.gpu.context import Context
from sarathi_lab.measure.gpu.plan import Step
from sarathi_lab.measure.gpu.steps import paper

ROOT = Path(__file__).resolve().parents[1]
# The GPU overlay's own keys (on_existing=skip, the experiment's sweeper axes dropped) on the CI scale.
STEP = Step("paper.pd_ratio", 1.0, "", "pd_ratio", (*scales.overrides("pd_ratio", "ci"), "executor=sim",
                                                    "on_existing=skip", "hydra.sweeper.params=null",
                                                    "scheduler=static,sarathi"))
NOW = engine_code.step_hash(STEP.name)  # the code this checkout's step measures: the sweep resumes
STOP_AT_JOB_2 = ("+hydra.callbacks.stop._target_=tests.sweep_callbacks.InterruptAtJob", "+hydra.callbacks.stop.job=2")

pytestmark = pytest.mark.e2e


def _digests(job: Path) -> dict[str, str]:
    return {str(p.relative_to(job)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(job.rglob("*"))
            if p.is_file()}


def test_a_sweep_cut_by_a_calls_end_resumes_in_the_next_call_without_loss(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    first, archive, second = tmp_path / "first", tmp_path / state.ARCHIVE, tmp_path / "second"
    sweep = paper.sweep_dir(first, STEP.arg, dry_run=False)
    sweep.mkdir(parents=True)
    # The first call ends after two of its four jobs (here a SIGINT between jobs; on the GPU the budget's SIGTERM).
    cut = subprocess.run([*paper.sweep_argv(STEP, sweep), *STOP_AT_JOB_2], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, check=False)
    assert cut.returncode == 130, cut.stderr[-3000:]
    state.write_result(first, state.StepResult(STEP.name, "incomplete", 1.0, 60.0, [], [], "cut", "abc1234", "cuda",
                                               NOW))
    state.write_summary(first, [STEP.name], {"commit": "abc1234"})
    state.archive(first, archive)
    finished = {p.parent.name: _digests(p.parent) for p in sweep.glob("*/metrics.json")}
    assert len(finished) == 2 and len(paper.job_overrides(STEP)) == 4

    # The queue reads the archive: two jobs left at the pace of the first call's two.
    monkeypatch.setattr(queue, "BY_NAME", {STEP.name: STEP})
    record = next(r for r in queue.suite_in_progress(archive) if r.step == STEP.name)
    assert (record.jobs_done, record.jobs_total) == (2, 4)
    resumed = queue.stopped_minutes([record], lambda r: r.code, NOW)
    assert resumed == (round(queue.MARGIN * 60.0 / 2 * 2 / 60, 1),
                       "measured this suite suite.tar.gz: resumes, 2 of 4 jobs left")
    # At other engine code the finished jobs measured another engine: the whole sweep is planned.
    assert "starts over" in queue.stopped_minutes([record], lambda r: r.code, "code-changed")[1]

    # The next call restores the archive and runs the step again: the two finished jobs are kept.
    state.restore(second, archive)
    again = paper.sweep_dir(second, STEP.arg, dry_run=False)
    assert {name: _digests(again / name) for name in finished} == finished
    ctx = Context(second, state.step_dir(second, STEP.name), False, "cpu", None)
    metrics, _ = paper.run(ctx, STEP)
    assert {m.metric: m.value for m in metrics} == {"jobs_ok": "4/4", "sweep_exit": 0}
    assert {name: _digests(again / name) for name in finished} == finished, "a finished job was run again"
    summary = json.loads((again / "sweep_summary.json").read_text())
    assert sorted(s["status"] for s in summary.values()) == ["ok", "ok", "skipped", "skipped"]


def test_a_sweep_run_at_other_engine_code_is_set_aside_and_starts_over(tmp_path):
    ctx = Context(tmp_path, state.step_dir(tmp_path, STEP.name), False, "cpu", None)
    sweep = paper.sweep_dir(tmp_path, STEP.arg, dry_run=False)
    (sweep / "0_job").mkdir(parents=True)
    (sweep / "0_job" / "metrics.json").write_text("{}")
    assert paper.set_aside_stale(ctx, STEP, sweep, NOW) is None  # no earlier result: nothing to set aside
    state.write_result(tmp_path, state.StepResult(STEP.name, "incomplete", 1.0, 60.0, code=NOW))
    assert paper.set_aside_stale(ctx, STEP, sweep, NOW) is None and sweep.is_dir()  # same code: it resumes
    state.write_result(tmp_path, state.StepResult(STEP.name, "incomplete", 1.0, 60.0, code="older"))
    note = paper.set_aside_stale(ctx, STEP, sweep, NOW)
    assert note and "starts over" in note and not sweep.exists()
    assert (ctx.dir / "stale_sweep_older" / "0_job" / "metrics.json").is_file()
    # A sweep done at other code and due again: its jobs would all be kept as done, none measured anew.
    (sweep / "0_job").mkdir(parents=True)
    state.write_result(tmp_path, state.StepResult(STEP.name, "done", 1.0, 60.0, code="oldest"))
    assert paper.set_aside_stale(ctx, STEP, sweep, NOW) and (ctx.dir / "stale_sweep_oldest" / "0_job").is_dir()
