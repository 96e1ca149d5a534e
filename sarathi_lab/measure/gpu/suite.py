"""python -m sarathi_lab.measure gpu: the GPU suite, resumable step by step (docs/gpu/README.md).

    python -m sarathi_lab.measure gpu --plan     # steps, expected minutes, how they fill calls
    python -m sarathi_lab.measure gpu --next --budget-min 9  # what is due, most valuable first
    # the queue's head:
    python -m sarathi_lab.measure gpu --next --run --budget-min 9 --restore .gpu/suite.tar.gz
    python -m sarathi_lab.measure gpu --dry-run              # every step on the CPU at tiny shapes
    # on the GPU machine:
    python -m sarathi_lab.measure gpu --out outputs/gpu --restore .gpu/suite.tar.gz
    python -m sarathi_lab.measure gpu --own  # your own GPU: the paper's setting, no budget

The driver does no device work: a worker process runs the steps, and a fresh one follows a worker
that dies, so a crash or a broken CUDA context costs one step, not the call.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from pathlib import Path

from sarathi_lab import cli_args
from sarathi_lab.config import REPO_ROOT
from sarathi_lab.harness.interrupts import end_child, signal_of, signals_interrupt
from sarathi_lab.measure.gpu import engine_code, own, queue, state
from sarathi_lab.measure.gpu.context import wait_or_stop
from sarathi_lab.measure.gpu.plan import Step, by_name, format_plan, named, select
from sarathi_lab.measure.gpu.worker import RESTART

# What a worker gets after SIGTERM to save its partial results.
GRACE_S = 15
GPU_BUDGET_MIN = 9.0


def pending(out: Path, steps: list[Step], named: set[str], retry_failed: bool) -> list[Step]:
    """Steps not done at their current engine code, nor failed before unless retried."""
    def due(step: Step) -> bool:
        last = state.read_result(out, step.name)
        if (last is not None and last.status == "failed"
                and not (retry_failed or step.name in named)):
            return False
        # A result that recorded no code (an older suite's) counts as done.
        return not (state.is_done(out, step.name)
                    and (last is None or not last.code
                         or last.code == engine_code.step_hash(step.name)))

    return [s for s in steps if due(s)]


def record_killed(out: Path, steps: list[Step], since: float, why: str) -> None:
    for step in steps:
        began = state.started_at(out, step.name)
        last = state.read_result(out, step.name)
        if began is not None and began >= since and (last is None or last.started_at < began):
            state.write_result(out, state.StepResult(step.name, "incomplete", began,
                                                     time.time() - began, error=why))


def run_worker(job: dict, watch: own.StepProgress | None = None) -> int:
    """worker.main's ``job``; its exit status. Interrupted: stopped as at a deadline."""
    # Weights drawn in float32, cast one by one: freed pages return before the KV cache.
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
           "PYTHONUNBUFFERED": "1"} | dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-m", "sarathi_lab.measure", "gpu_worker",
                             json.dumps(job)],
                            cwd=REPO_ROOT, env=env, start_new_session=True)
    deadline = job["deadline"]
    try:
        while watch is not None and deadline is None and proc.poll() is None:
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=own.POLL_S)
            for line in watch.poll():
                print(line, flush=True)
        code = wait_or_stop(proc, None if deadline is None else max(1.0, deadline - time.time()),
                            GRACE_S)
    except (KeyboardInterrupt, own.Stopped):
        end_child(proc, signal.SIGTERM, GRACE_S)  # it ends its sweep; what is left is killed
        raise
    return -signal.SIGTERM if code is None else code


def print_table(out: Path, names: list[str]) -> None:
    print(f"\n{'step':28} {'status':11} {'s':>6}  key results / error")
    for r in state.results(out, names):
        shown = "; ".join(
            f"{m.metric}={m.value}{'' if m.holds is None else (' ok' if m.holds else ' MISSED')}"
            for m in r.metrics if m.target)[:160]
        print(f"{r.step:28} {r.status:11} {r.seconds:6.0f}  {r.error or shown}")


def run_steps(job: dict, todo: list[Step], out: Path, deadline: float | None, budget: float | None,
              watch: own.StepProgress | None) -> bool:
    """Workers until ``todo`` is settled or the budget ends; True where one died settling none."""
    while todo:
        if deadline and not any(time.time() + s.minutes * 60 <= deadline for s in todo):
            for s in todo:
                when = ("deferred to the next call" if s.minutes <= budget
                        else f"not started at --budget-min={budget:g}")
                print(f"[gpu] {s.name}: {when} ({s.minutes:.1f} min expected, "
                      f"{max(0.0, deadline - time.time()) / 60:.1f} left)")
            break
        worker_start = time.time()
        batch, stop = capped(todo, worker_start, deadline)
        code = run_worker(job | {"steps": [s.name for s in batch], "deadline": stop}, watch)
        out_of_time = bool(deadline) and time.time() >= deadline
        at_cap = stop != deadline and time.time() >= stop
        if code not in (0, RESTART):
            record_killed(out, batch, worker_start, f"worker ended with {code}" + (
                " at the end of the call's budget" if out_of_time else
                (f" at its cap of {queue.CAPS[batch[0].name]:g}x "
                 "its planned minutes") if at_cap else ""))
        # One attempt per step and call: what the worker started is settled for this call.
        left = [s for s in todo if (state.started_at(out, s.name) or 0) < worker_start
                and not ((r := state.read_result(out, s.name)) and r.started_at >= worker_start)]
        if code not in (0, RESTART) and len(left) == len(todo) and not out_of_time:
            # Died before a step began: a fresh worker would die the same way until the budget ends.
            print(f"[gpu] the worker ended with {code} before it settled any step; not restarted "
                  "(its error is above)")
            return True
        if out_of_time:
            break
        # A worker that ended on its own went through its batch: deferrals wait for the next call.
        todo = [s for s in left if s not in batch] if code == 0 else left
    return False


def capped(todo: list[Step], now: float, deadline: float | None) -> tuple[list[Step], float | None]:
    """The next worker's steps and deadline: a capped step (queue.CAPS) runs alone, to its cap."""
    first = todo[0]
    if deadline is None:
        return todo, None
    if first.name in queue.CAPS:
        cap = now + queue.CAPS[first.name] * first.minutes * 60
        return [first], min(cap, deadline)
    upto = next((i for i, s in enumerate(todo) if s.name in queue.CAPS), len(todo))
    return todo[:upto], deadline


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    steps, budget, parts = _selected(parser, args)
    if args.plan:
        print(format_plan(steps, None if args.own else budget or GPU_BUDGET_MIN, parts))
        return 0
    if args.run and not args.next:
        parser.error("--run is invalid without --next: it runs "
                     "the queue's head (--steps runs chosen steps)")
    if args.next:
        steps = _queue_head(parser, args, budget)
        if steps is None:
            return 0
    try:
        out = (own.out_dir(args.out, args.dry_run) if args.own else
               args.out or REPO_ROOT / "outputs" / ("gpu-dry" if args.dry_run else "gpu")).resolve()
    except ValueError as e:
        parser.error(str(e))
    # Here, not in the worker: the driver writes the summary even when no worker starts.
    if problem := writable_dir(out):
        parser.error(f"--out={out} is invalid: must be a directory this user can write ({problem})")
    # $OUT is where a remote job's files come back from; an own run's folder is its result.
    export = None if args.own else _export_dir(parser, out)
    _restore(parser, args.restore, out, export)
    return _run_suite(parser, args, steps, out, export, budget)


def _parser() -> argparse.ArgumentParser:
    parser = cli_args.Parser(prog="python -m sarathi_lab.measure gpu",
                             description=__doc__.split("\n\n")[0],
                             formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)

    def switch(flag: str, what: str) -> None:  # an option on or off, off unless given
        parser.add_argument(flag, action="store_true", help=what)

    switch("--plan", "print the steps and expected minutes, run nothing")
    switch("--next", "the queue: every step still due at this engine code, call by call, most "
                     "valuable first (runs kept in docs/gpu/, and --out's or --restore's "
                     "unfinished suite)")
    switch("--run", "with --next: run the queue's head, the steps of its first call")
    switch("--dry-run", "every step on the CPU at tiny shapes")
    parser.add_argument("--steps", default=None,
                        help="comma-separated steps or groups (default: all)")
    cli_args.shared(parser, out="results (default outputs/gpu, or outputs/gpu-dry; --own: "
                                "outputs/paper_gpu/<device>/)")
    parser.add_argument("--budget-min", type=float, default=None,
                        help=f"minutes this call may run steps (default {GPU_BUDGET_MIN:g} on a "
                             "GPU, none dry)")
    parser.add_argument("--restore", type=Path, default=None,
                        help="an earlier call's suite.tar.gz: its "
                             "files the out directory lacks are restored")
    switch("--retry-failed", "rerun steps that failed before")
    switch("--own", "your own GPU: every step at the paper's setting, no call budget, a progress "
                    "line a job with the time left; claims and figures in "
                    "outputs/paper_gpu/<device>/")
    return parser


def _selected(parser: argparse.ArgumentParser,
              args: argparse.Namespace) -> tuple[list[Step], float | None, dict | None]:
    """The steps chosen, with the minutes the kept leases measured (--own: the paper's settings,
    planned), the call's budget, and the paper steps' parts."""
    if args.own and (args.budget_min is not None or args.restore):
        parser.error(f"--{'budget-min' if args.budget_min is not None else 'restore'} is invalid "
                     "with --own: a run on your own GPU has no call budget and no archive to "
                     "resume from (its folder is)")
    try:
        steps = select(args.steps, unscaled=args.own)
    except ValueError as e:
        parser.error(str(e))
    parts = None
    if not args.own:
        steps, parts = queue.measured(steps, REPO_ROOT / "docs" / "gpu")
    budget = (args.budget_min if args.budget_min is not None
              else None if args.dry_run or args.own else GPU_BUDGET_MIN)
    if budget is not None and not 0 < budget < float("inf"):
        parser.error(f"--budget-min={budget} is invalid: must be a positive number of minutes")
    # Else every call would start nothing and exit 3, "call again", forever.
    _check_fits(parser, budget, steps, "no selected step")
    return steps, budget, parts


def _check_fits(parser: argparse.ArgumentParser, budget: float | None, steps: list[Step],
                which: str) -> None:
    if budget is not None and steps and budget < (least := min(s.minutes for s in steps)):
        parser.error(f"--budget-min={budget:g} is invalid: {which} fits in it (the shortest "
                     f"expects {least:.1f} min); allowed: >= {least:.1f}")


def _queue_head(parser: argparse.ArgumentParser, args: argparse.Namespace,
                budget: float | None) -> list[Step] | None:
    """Prints the queue; with --run, returns the steps of its first call (and sets args.steps)."""
    if args.own or args.steps:
        parser.error(f"--{'own' if args.own else 'steps'} is invalid with --next: the queue "
                     "chooses the steps (run them on your own GPU with --own, or choose them with "
                     "--steps alone)")
    docs = REPO_ROOT / "docs" / "gpu"
    planned = queue.plan_steps(queue.kept_runs(docs) + [
        r for source in (args.out or REPO_ROOT / "outputs" / "gpu", args.restore) if source
        for r in queue.suite_in_progress(source)], kept_parts=queue.kept_parts(docs))
    print(queue.format_queue(planned, budget or GPU_BUDGET_MIN, engine_code.short_commit() or "?"))
    chosen = queue.head(planned, budget or GPU_BUDGET_MIN)
    if not args.run or not chosen:
        return None
    print(f"\n[gpu] running the queue's head: {', '.join(chosen)}")
    args.steps = ",".join(chosen)
    return queue.measured(select(args.steps), REPO_ROOT / "docs" / "gpu")[0]


def _export_dir(parser: argparse.ArgumentParser, out: Path) -> Path | None:
    """$OUT, checked to be a writable folder apart from out; None where unset."""
    export = Path(os.environ["OUT"]).resolve() if os.environ.get("OUT") else None
    if export is not None and (export == out or export.is_relative_to(out)
                               or out.is_relative_to(export)):
        parser.error(f"$OUT={export} is invalid: it must be a folder apart from --out={out} (the "
                     "archive of --out is written into $OUT)")
    if export is not None and (problem := writable_dir(export)):
        parser.error(f"$OUT={export} is invalid: must be a "
                     f"directory this user can write ({problem})")
    return export


def _restore(parser: argparse.ArgumentParser, archive: Path | None, out: Path,
             export: Path | None) -> None:
    if archive and archive.resolve() in (out, export):
        parser.error(f"--restore={archive} is invalid: it is "
                     "the out directory itself, not an archive")
    if archive and not archive.exists():
        print(f"[gpu] no archive at {archive} yet: nothing restored (a suite's first call)")
    elif archive:
        try:
            print(f"[gpu] restored {state.restore(out, archive)} files from {archive}")
        except ValueError as e:
            parser.error(str(e))


def _run_suite(parser: argparse.ArgumentParser, args: argparse.Namespace, steps: list[Step],
               out: Path, export: Path | None, budget: float | None) -> int:
    deadline = time.time() + budget * 60 if budget else None
    names = [s.name for s in steps]
    suite = {"dry_run": args.dry_run, "commit": engine_code.short_commit() or "?",
             "budget_min": budget, "started": time.strftime("%F %T"), "own": args.own}
    job = {"out": str(out), "deadline": deadline, "export": export and str(export), "suite": suite}
    todo = pending(out, steps, named(args.steps), args.retry_failed)
    _check_fits(parser, budget, todo, f"none of the {len(todo)} steps left in {out}")
    stalled = interrupted = False
    print(f"[gpu] {len(steps) - len(todo)} of {len(steps)} steps already finished (or failed "
          f"before) in {out}")
    watch = own.start(out, todo, args.dry_run) if args.own else None
    began = time.time()
    try:
        with signals_interrupt(signal.SIGINT, signal.SIGTERM):
            stalled = run_steps(job, todo, out, deadline, budget, watch)
    except (KeyboardInterrupt, own.Stopped) as e:
        record_killed(out, todo, began, "interrupted")
        interrupted = 128 + signal_of(e) if isinstance(e, KeyboardInterrupt) else 130
    # Every step with a result, this call's or an earlier one's: the summary is the suite's.
    state.write_summary(out, list(by_name(args.own)), suite)
    for note in state.export(out, export):
        print(f"[gpu] {note}")
    print_table(out, names)
    code = exit_code(out, names)
    if watch is not None:
        own.finish(watch, out)
    if interrupted:
        print("[gpu] interrupted: the same command resumes "
              "(finished steps and sweep jobs are kept)")
        return interrupted
    # Not 3 ("more to run"): the same call again would stall the same way.
    return 1 if stalled else code


def writable_dir(path: Path) -> str | None:
    """Why ``path`` cannot be a folder to write into (tried with a file), or None."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        return e.strerror or str(e)
    return None


def exit_code(out: Path, names: list[str]) -> int:
    """0: all done (or unavailable); 3: the same call runs more; 1: nothing more, a step failed."""
    status = {n: (r.status if (r := state.read_result(out, n)) else "not started") for n in names}
    left = [n for n, s in status.items() if s not in ("done", "unavailable")]
    print(f"\n[gpu] {sum(s == 'done' for s in status.values())} of {len(names)} steps done" +
          (f"; not done: {', '.join(f'{n} ({status[n]})' for n in left)}" if left else ""))
    if any(s != "failed" for s in map(status.get, left)):
        return 3
    return 1 if left else 0
