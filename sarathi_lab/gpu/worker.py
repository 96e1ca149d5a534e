"""Runs the suite's steps in one process, each recorded as it ends. After a step fails on a GPU it
exits with RESTART (a CUDA error can leave the context unusable): the driver starts a fresh one."""
from __future__ import annotations

import argparse
import gc
import importlib
import logging
import sys
import time
import traceback
from pathlib import Path

from sarathi_lab.gpu import state
from sarathi_lab.gpu.context import Context, Incomplete, Unavailable
from sarathi_lab.gpu.plan import BY_NAME, Step

RESTART = 75


def run_step(step: Step, ctx: Context, commit: str) -> state.StepResult:
    started = time.time()
    state.mark_started(ctx.out, step.name)
    status, metrics, notes, error = "done", [], [], ""
    try:
        metrics, notes = importlib.import_module(f"sarathi_lab.gpu.steps.{step.module}").run(ctx, step)
    except Unavailable as e:
        status, error = "unavailable", str(e)
    except Incomplete as e:
        status, error = "incomplete", str(e)
    except Exception as e:  # noqa: BLE001 (a step's failure is its result; the suite goes on)
        text = str(e).strip().splitlines()
        status, error = "failed", f"{type(e).__name__}: {text[0] if text else ''}"[:500]
        (ctx.dir / "traceback.txt").write_text(traceback.format_exc())
    result = state.StepResult(step.name, status, started, time.time() - started, metrics, notes, error, commit,
                              ctx.device)
    state.write_result(ctx.out, result)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sarathi_lab.gpu.worker")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", required=True)
    parser.add_argument("--all-steps", required=True, help="every step of this invocation, for the summary")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--deadline", type=float, default=None)
    parser.add_argument("--export", type=Path, default=None)
    parser.add_argument("--suite", default="{}", help="the suite's record (JSON) for the summary")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    import json

    import torch  # after the parse: --help stays fast

    device = "cpu" if args.dry_run or not torch.cuda.is_available() else "cuda"
    all_steps = args.all_steps.split(",")
    suite = json.loads(args.suite) | {"device": device}
    code = 0
    for name in args.steps.split(","):
        step = BY_NAME[name]
        if args.deadline is not None and time.time() + step.minutes * 60 > args.deadline:
            print(f"[gpu] {name}: deferred to the next call ({step.minutes:.1f} min expected, "
                  f"{(args.deadline - time.time()) / 60:.1f} left)", flush=True)
            continue
        print(f"[gpu] {name}: starting ({step.minutes:.1f} min expected)", flush=True)
        ctx = Context(args.out, state.step_dir(args.out, name), args.dry_run, device, args.deadline)
        result = run_step(step, ctx, suite.get("commit", ""))
        print(f"[gpu] {name}: {result.status} in {result.seconds:.0f} s {result.error}", flush=True)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        state.write_summary(args.out, all_steps, suite)
        state.export(args.out, args.export)
        if result.status == "failed" and device == "cuda":
            code = RESTART
            break
    from sarathi_lab.gpu.report import write_report

    for note in write_report(args.out):
        print(f"[gpu] report: {note}", flush=True)
    state.write_summary(args.out, all_steps, suite)
    state.export(args.out, args.export)
    return code


if __name__ == "__main__":
    sys.exit(main())
