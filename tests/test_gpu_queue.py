"""The GPU queue (python -m sarathi_lab.measure gpu --next): its order, its resume from earlier runs, a step due
again when its engine code changes, and calls that fit their budget."""
from __future__ import annotations

import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from sarathi_lab.measure.gpu import engine_code, queue, state
from sarathi_lab.measure.gpu.packing import pack
from sarathi_lab.measure.gpu.plan import BY_NAME, STEPS
from sarathi_lab.measure.gpu.queue import Record
from sarathi_lab.measure.gpu.suite import capped, pending

ROOT = Path(__file__).resolve().parents[1]


def code(name: str) -> str:
    return f"code-of-{name}"


def record(step: str, status: str = "done", seconds: float = 10.0, code_: str | None = None, commit: str = "abc1234",
           device: str = "h200", run: str = "2026-11-27_abc1234", started: float = 1.0) -> Record:
    return Record(step, status, seconds, started, commit, code(step) if code_ is None else code_, device, run)


def plan(records: list[Record], at_commit=lambda name, commit: None) -> dict[str, queue.Planned]:
    return queue.plan_steps(records, current=code, at_commit=at_commit)


def test_the_queue_orders_the_headline_first_then_the_issues_calls():
    calls = [[s.name for s in steps] for _, steps in queue.ordered()]
    assert calls[0] == ["env", "launch", "attention", "hybrid", "tune", "engine", "overhead"]
    # The sweep a call cut resumes first, beside the Orca comparison; then P:D; then Sarathi-Serve's claims.
    assert calls[1] == ["paper.decode_speedup", "paper.orca_compare"]
    assert calls[2] == ["paper.pd_ratio"]
    assert calls[3] == ["paper.capacity.strict", "paper.scheduler_latency"]
    assert calls[4] == ["profile.llama-13b", "profile.mistral-7b"]
    assert "kernels" in calls[-1] and "paper.chunk_overhead" in calls[-1]
    # Every suite step is in exactly one call: the rest last, in suite order.
    flat = [n for call in calls for n in call]
    assert sorted(flat) == sorted(s.name for s in STEPS) and len(flat) == len(set(flat))
    assert calls[-1] == [s.name for s in STEPS if s.name in calls[-1]]


def test_every_name_in_the_queue_is_a_suite_step_except_those_still_to_land():
    for call in queue.QUEUE:
        for pattern in call.steps:
            assert pattern == "tune" or any(queue.matches(pattern, s) for s in STEPS), pattern


def test_the_suite_runs_its_head_in_the_queues_order():
    # --steps runs in suite order: the headline call must be that order too.
    head = [s.name for s in queue.ordered()[0][1]]
    assert [s.name for s in STEPS[:len(head)]] == head


def test_a_step_done_at_the_current_code_is_not_repeated():
    planned = plan([record("env"), record("launch", status="incomplete"), record("kernels", status="failed")])
    assert not planned["env"].due and planned["env"].done_at == "h200 2026-11-27_abc1234"
    assert planned["launch"].due and planned["kernels"].due
    calls = pack([ps for _, ps in queue.due_in_order(planned)], 9.0).calls
    assert "env" not in [p.step.name for call in calls for p in call]
    assert queue.head(planned, 9.0)[0] == "launch"


def test_a_step_whose_code_changed_since_is_due_again():
    planned = plan([record("env", code_="older"), record("engine")])
    assert planned["env"].due and not planned["engine"].due


def test_a_record_with_only_its_commit_is_judged_at_that_commits_code():
    asked = []

    def at_commit(name, commit):
        asked.append((name, commit))
        return code(name) if commit == "same" else "other"

    planned = plan([record("env", code_="", commit="same"), record("kernels", code_="", commit="old")], at_commit)
    assert not planned["env"].due and planned["kernels"].due
    assert ("env", "same") in asked
    # A commit git does not know: due (never wrongly skipped).
    assert plan([record("env", code_="", commit="?")])["env"].due


def test_measured_minutes_replace_the_plan_when_longer_and_are_shown_when_shorter():
    long = record("attention", status="incomplete", seconds=600, code_="old")
    planned = plan([long, record("kernels", seconds=6, code_="old"),
                    record("engine", seconds=200, code_="old", device="h100", run="r1"),
                    record("engine", seconds=100, code_="old", device="h200", run="r2")])
    attention = planned["attention"]
    assert attention.minutes == round(queue.MARGIN * 10, 1) and "measured h200" in attention.source
    assert "stopped" in attention.source and attention.cap_min == round(queue.CAPS["attention"] * attention.minutes, 1)
    kernels = planned["kernels"]
    assert kernels.minutes == BY_NAME["kernels"].minutes and kernels.source.startswith("planned (")
    assert planned["engine"].minutes == round(queue.MARGIN * 200 / 60, 1) and "h100 r1" in planned["engine"].source
    assert planned["launch"].source == "planned"


def test_only_each_devices_newest_run_sets_the_minutes():
    old = record("engine", seconds=900, code_="old", started=1.0, run="old")
    new = record("engine", seconds=100, code_="old", started=2.0, run="new")
    assert plan([old, new])["engine"].minutes == round(queue.MARGIN * 100 / 60, 1)


@pytest.mark.parametrize("budget", [0.5, 2.0, 4.5, 9.0, 30.0])
def test_calls_fit_their_budget_keep_the_order_and_leave_out_only_what_no_call_holds(budget):
    planned = plan([])
    groups = [ps for _, ps in queue.due_in_order(planned)]
    packed = pack(groups, budget)
    calls, too_long = packed.calls, packed.too_long
    assert all(call and sum(p.minutes for p in call) <= budget + 1e-9 for call in calls)
    flat = [p.step.name for call in calls for p in call]
    order = [p.step.name for g in groups for p in g]
    # In order within each call; across a group's calls a later, shorter step may start before an
    # earlier one that waits (the worker's rule, packing.py): no longer the queue's order overall.
    assert all([p.step.name for p in call] == [n for n in order if n in {p.step.name for p in call}]
               for call in calls)
    assert sorted(flat + [p.step.name for p in too_long]) == sorted(order)
    assert all(p.minutes > budget for p in too_long)
    # A call never holds two of the queue's calls: the headline is measured before anything else.
    group_of = {p.step.name: i for i, g in enumerate(groups) for p in g}
    assert all(len({group_of[p.step.name] for p in call}) == 1 for call in calls)
    firsts = [group_of[call[0].step.name] for call in calls]
    assert firsts == sorted(firsts)
    assert queue.head(planned, budget) == [p.step.name for p in calls[0]]


def test_the_second_call_is_sized_by_the_minutes_left():
    done = [record(s.name) for s in queue.ordered()[0][1]]
    head = queue.head(plan(done), 4.5)
    assert head == ["paper.decode_speedup"]  # orca_compare's minutes would not fit beside it


def test_format_names_steps_minutes_what_each_call_shows_and_its_predictions():
    text = queue.format_queue(plan([record("env")]), 9.0, "abc1234")
    assert "call 1:" in text and "attention" in text and "stopped at" in text and "planned" in text
    assert "shows: " in text and "predictions first: " in text and "env (h200 2026-11-27_abc1234)" in text
    nothing = queue.format_queue(plan([record(s.name) for s in STEPS]), 9.0, "abc1234")
    assert "nothing due" in nothing


def test_kept_runs_read_every_run_under_docs_gpu():
    records = queue.kept_runs(ROOT / "docs" / "gpu")
    runs = {(r.device, r.run) for r in records}
    assert ("h200", "2026-11-27_9e2ae41") in runs and ("h100", "2026-11-26_27958ff") in runs
    assert any(r.step == "launch" and r.status == "done" and r.seconds > 0 for r in records)


def test_an_unfinished_suite_is_read_from_its_folder_and_its_archive(tmp_path):
    out = tmp_path / "out"
    state.write_result(out, state.StepResult("env", "done", time.time(), 12.0, code="x", device="cuda"))
    state.write_result(out, state.StepResult("kernels", "done", time.time(), 1.0, code="y", device="cpu"))
    from_dir = queue.suite_in_progress(out)
    assert [(r.step, r.status, r.code) for r in from_dir] == [("env", "done", "x")]  # a dry run measured nothing
    state.write_summary(out, ["env"], {})
    archive = tmp_path / "suite.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(out / "summary.json", arcname="summary.json")
    assert [r.step for r in queue.suite_in_progress(archive)] == ["env"]
    assert queue.suite_in_progress(tmp_path / "missing.tar.gz") == []
    (tmp_path / "bad.tar.gz").write_bytes(b"not a tar")
    assert queue.suite_in_progress(tmp_path / "bad.tar.gz") == []


def test_the_engine_code_hash_of_a_tree_equals_its_commits_and_follows_its_source(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    src = tmp_path / "sarathi_lab" / "engine"
    src.mkdir(parents=True)
    (src / "a.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    paths = ("sarathi_lab/engine",)
    first = engine_code.tree_hash(paths, tmp_path)
    assert first == engine_code.commit_hash(paths, "HEAD", tmp_path)
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "a.cpython-312.pyc").write_bytes(b"\0")
    (src / "notes.txt").write_text("not source")
    assert engine_code.tree_hash(paths, tmp_path) == first
    (src / "a.py").write_text("x = 2\n")
    assert engine_code.tree_hash(paths, tmp_path) != first
    assert engine_code.commit_hash(paths, "0" * 40, tmp_path) is None


def test_each_step_depends_on_its_module_and_a_paper_step_on_its_result():
    assert "sarathi_lab/measure/gpu/steps/launch.py" in engine_code.paths_of("launch")
    assert "sarathi_lab/engine" in engine_code.paths_of("launch")
    paper = engine_code.paths_of("paper.scheduler_latency.seed0-qps2")
    assert "sarathi_lab/analysis/paper_results/scheduler_latency.py" in paper and "sarathi_lab/harness" in paper


def test_the_driver_reruns_a_done_step_whose_code_changed(tmp_path):
    now = engine_code.step_hash("env")
    state.write_result(tmp_path, state.StepResult("env", "done", time.time(), 1.0, code=now))
    state.write_result(tmp_path, state.StepResult("engine", "done", time.time(), 1.0, code="older"))
    state.write_result(tmp_path, state.StepResult("overhead", "done", time.time(), 1.0))  # an older suite's
    todo = pending(tmp_path, [BY_NAME[n] for n in ("env", "engine", "overhead")], set(), retry_failed=False)
    assert [s.name for s in todo] == ["engine"]


def test_a_capped_step_runs_alone_and_is_stopped_at_its_cap():
    todo = [BY_NAME[n] for n in ("env", "launch", "attention", "kernels")]
    now, deadline = 1000.0, 1000.0 + 9 * 60
    batch, stop = capped(todo, now, deadline)
    assert [s.name for s in batch] == ["env", "launch"] and stop == deadline
    batch, stop = capped(todo[2:], now, deadline)
    assert [s.name for s in batch] == ["attention"]
    assert stop == pytest.approx(now + queue.CAPS["attention"] * BY_NAME["attention"].minutes * 60)
    assert capped(todo[2:], now, now + 10)[1] == now + 10        # never past the call's end
    assert capped(todo, now, None) == (todo, None)               # no budget (own GPU, dry run): no cap


def test_next_prints_the_queue_and_run_needs_next(tmp_path):
    env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'kernels'}", "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", "gpu", "--next", "--budget-min", "9", "--out",
                          str(tmp_path)], check=False, cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "call 1:" in run.stdout and "shows:" in run.stdout
    bad = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", "gpu", "--run"], check=False, cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--run is invalid without --next" in bad.stderr


def test_a_stopped_sweep_is_sized_by_the_jobs_it_has_left():
    # A decode_speedup sweep a call stopped with 20 of its 36 jobs finished, in 232 s.
    files = [f"paper/decode_speedup/multiruns/gpu/{i}_job/metrics.json" for i in range(20)]
    files += ["paper/decode_speedup/multiruns/ci-dry/0/metrics.json", "paper/pd_ratio/multiruns/gpu/0_job/metrics.json"]
    [stopped] = queue.with_jobs([record("paper.decode_speedup", "incomplete", seconds=232, device="h100")], files)
    assert (stopped.jobs_done, stopped.jobs_total) == (20, 36)
    resumed = plan([stopped])["paper.decode_speedup"]
    assert resumed.minutes == round(queue.MARGIN * 232 / 20 * 16 / 60, 1) and "16 of 36 jobs left" in resumed.source
    # Stopped at other engine code, its jobs measured another engine: the whole sweep again, at that pace.
    [other] = queue.with_jobs([record("paper.decode_speedup", "incomplete", seconds=232, code_="old")], files)
    again = plan([other])["paper.decode_speedup"]
    assert again.minutes == round(queue.MARGIN * 232 / 20 * 36 / 60, 1) and "starts over" in again.source
    # A done step, or one that left no finished job, counts none.
    assert queue.with_jobs([record("paper.pd_ratio")], files)[0].jobs_total == 0
    # The queue's second call: the sweep's rest beside orca_compare, in one call that fits both.
    head = [record(s.name) for s in queue.ordered()[0][1]]
    budget = resumed.minutes + BY_NAME["paper.orca_compare"].minutes
    assert queue.head(plan([*head, stopped]), budget) == ["paper.decode_speedup", "paper.orca_compare"]
