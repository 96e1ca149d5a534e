"""Runs the suite's steps, a paper step's sweep in this process (process_groups.py); after a GPU
step fails, or a sweep's job, exits RESTART (CUDA errors poison contexts)."""
from __future__ import annotations

import gc
import importlib
import json
import logging
import signal
import sys
import time
import traceback
from pathlib import Path

from sarathi_lab.harness.interrupts import Interrupted, signals_interrupt
from sarathi_lab.measure.gpu import engine_code, state
from sarathi_lab.measure.gpu.context import Context, Incomplete, Unavailable
from sarathi_lab.measure.gpu.plan import Step, by_name
from sarathi_lab.measure.gpu.process_groups import SHARED_ENGINE_GROUPS
from sarathi_lab.model.shared_engine import SHARED

RESTART = 75


def run_step(step: Step, ctx: Context, commit: str) -> state.StepResult:
    started = time.time()
    code = engine_code.step_hash(step.name)  # before it runs: the code it measures
    state.mark_started(ctx.out, step.name)
    status, metrics, notes, error = "done", [], [], ""
    try:
        module = importlib.import_module(f"sarathi_lab.measure.gpu.steps.{step.group}")
        metrics, notes = module.run(ctx, step)
    except Unavailable as e:
        status, error = "unavailable", str(e)
    except Incomplete as e:
        status, error = "incomplete", str(e)
    except Exception as e:  # noqa: BLE001 (a step's failure is its result; the suite goes on)
        text = str(e).strip().splitlines()
        status, error = "failed", f"{type(e).__name__}: {text[0] if text else ''}"[:500]
        (ctx.dir / "traceback.txt").write_text(traceback.format_exc())
    result = state.StepResult(step.name, status, started, time.time() - started, metrics, notes,
                              error, commit, ctx.device, code)
    state.write_result(ctx.out, result)
    return result


def main(argv: list[str] | None = None) -> int:
    """``argv``: the driver's JSON (out, steps, deadline, export, suite record)."""
    job = json.loads((argv or sys.argv[1:])[0])
    out, deadline, suite = Path(job["out"]), job["deadline"], job["suite"]
    export = job["export"] and Path(job["export"])
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    import torch  # lazy: the driver imports RESTART from here without torch

    device = "cpu" if suite["dry_run"] or not torch.cuda.is_available() else "cuda"
    suite |= {"device": device}
    steps = by_name(suite.get("own", False))  # --own: the paper sweeps at the paper's setting
    try:
        with signals_interrupt(signal.SIGINT, signal.SIGTERM):  # a sweep under way is ended too
            return _run(job, steps, out, deadline, suite, export, device)
    except Interrupted as e:
        print(f"[gpu] worker interrupted ({e}): the step under way is left unfinished", flush=True)
        return e.exit_code


def _run(job: dict, steps: dict[str, Step], out: Path, deadline: float | None, suite: dict,
         export: Path | None, device: str) -> int:
    import torch

    code = 0
    for name in job["steps"]:
        step = steps[name]
        if deadline is not None and time.time() + step.minutes * 60 > deadline:
            print(f"[gpu] {name}: deferred to the next call ({step.minutes:.1f} min expected, "
                  f"{(deadline - time.time()) / 60:.1f} left)", flush=True)
            continue
        print(f"[gpu] {name}: starting ({step.minutes:.1f} min expected)", flush=True)
        # A paper step's sweep runs here (steps/paper.py): steps of one model reuse the model the
        # one before built. Any other step builds its own: both would not fit a card.
        if step.group not in SHARED_ENGINE_GROUPS:
            SHARED.release()
        ctx = Context(out, state.step_dir(out, name), suite["dry_run"], device, deadline)
        result = run_step(step, ctx, suite.get("commit", ""))
        print(f"[gpu] {name}: {result.status} in {result.seconds:.0f} s {result.error}", flush=True)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        state.write_summary(out, list(steps), suite)
        state.export(out, export)
        # A sweep's failed job may have left the CUDA context broken for the steps after it.
        if device == "cuda" and (result.status == "failed" or _sweep_failed(result)):
            code = RESTART
            break
    from sarathi_lab.measure.gpu.report import write_report

    for note in write_report(out, suite["dry_run"]):
        print(f"[gpu] report: {note}", flush=True)
    state.write_summary(out, list(steps), suite)
    state.export(out, export)
    return code


def _sweep_failed(result: state.StepResult) -> bool:
    return any(m.metric == "sweep_exit" and m.value != 0 for m in result.metrics)

