"""A paper result's sweep (``experiment=gpu/NAME``); dry: every job's schema and plan, one run."""
from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sarathi_lab.engine.block_manager import blocks_for
from sarathi_lab.harness import scales
from sarathi_lab.harness.results import SWEEP_SUMMARY, read_json
from sarathi_lab.measure.gpu import engine_code, parts, state
from sarathi_lab.measure.gpu.context import Context, Incomplete
from sarathi_lab.measure.gpu.engine_code import ENGINE, RUNS
from sarathi_lab.measure.gpu.state import Metric
from sarathi_lab.measure.gpu.steps import Declared
from sarathi_lab.measure.gpu.sweep_here import run_sweep

if TYPE_CHECKING:  # the planner reads this module's STEP as it makes the steps
    from sarathi_lab.measure.gpu.plan import Step


def result_paths(name: str) -> tuple[str, ...]:
    """``paper.<result>[.<part>]``: the result's module (its GpuRun; its overlays are in conf)."""
    return (f"sarathi_lab/analysis/paper_results/{name.split('.')[1]}.py",)


# One step per registered result's sweep (or part of one), made by the planner (plan.build_steps).
STEP = Declared(paths=(*ENGINE, *RUNS), step_paths=result_paths)

# A sweep is stopped this long before the call's deadline, its job recording itself interrupted.
GRACE_S = 10
# The dry run's KV plan: the card's "80 GB", below its total, for what CUDA and the allocator keep.
H100_BYTES = 80 * 10**9
SWEPT_IN_DRY_RUN = "per_token_cost"


def dry_job(step: Step) -> list[str]:
    return list(scales.overrides(step.arg, "dry"))


def sweep_dir(out: Path, name: str, dry_run: bool) -> Path:
    # analysis.Results labels a "ci-" sweep folder as the quick scale.
    return out / "paper" / name / "multiruns" / ("ci-dry" if dry_run else "gpu")


def sweep_argv(step: Step, directory: Path, dry_run: bool = False) -> list[str]:
    overrides = dry_job(step) if dry_run else list(step.overrides)
    return [sys.executable, "-m", "sarathi_lab.run", "-m", f"experiment={step.arg}",
            f"hydra.sweep.dir={directory}", *overrides]


def job_overrides(step: Step) -> list[list[str]]:
    """Every job of the GPU sweep as the command line's swept overrides."""
    axes = [[f"{key}={v}" for v in values.split(",")]
            for key, values in (o.split("=", 1) for o in step.overrides) if key != scales.EXCLUDE]
    return [[f"experiment={step.arg}", *job] for job in itertools.product(*axes)]


def check_gpu_jobs(step: Step) -> list[Metric]:
    """Each GPU job through the schema, and its KV blocks against an 80 GB card's plan."""
    import torch

    from sarathi_lab.harness.compose import compose_config
    from sarathi_lab.harness.schema import parse_config
    from sarathi_lab.model.memory import plan_kv_blocks
    from sarathi_lab.plan import ModelLimits, scheduler_config_of

    worst = 0.0
    jobs = job_overrides(step)
    for job in jobs:
        # Checked as a CPU job (device=cuda needs one), planned in its dtype on CUDA.
        cfg = parse_config(compose_config([o if not o.startswith("device=") else "device=cpu"
                                           for o in job]))
        engine, limits = cfg.engine, ModelLimits.of(cfg.engine)
        sched = scheduler_config_of(engine, limits.max_model_len)
        blocks = plan_kv_blocks(engine, limits.config, sched, limits.max_model_len,
                                getattr(torch, engine.dtype),
                                torch.device("cuda"), available=H100_BYTES)
        worst = max(worst, cfg.batch_size * blocks_for(cfg.seq_len, engine.block_size) / blocks)
    return [Metric("gpu_jobs_validated", len(jobs)),
            Metric("gpu_worst_kv_need_over_80GB_room", round(worst, 2), "x", "<= 1", worst <= 1)]


def set_aside_stale(ctx: Context, step: Step, directory: Path, now: str) -> str | None:
    """A sweep run at other engine code is moved aside to start over; a note, or None: resumes."""
    before = state.read_result(ctx.out, step.name)
    if before is None or not before.code or before.code == now or not directory.is_dir():
        return None
    stale = ctx.dir / f"stale_sweep_{before.code}"
    directory.rename(stale)
    return (f"{step.arg}: the sweep run at engine code {before.code} starts over at {now} "
            f"(set aside: {stale.name})")


def run(ctx: Context, step: Step) -> tuple[list[Metric], list[str]]:
    checked = check_gpu_jobs(step) if ctx.dry_run else []
    if ctx.dry_run and step.arg != SWEPT_IN_DRY_RUN:
        from sarathi_lab.harness.compose import run_in_process

        args = [f"experiment={step.arg}", *dry_job(step)]
        status = run_in_process(args, sweep_dir(ctx.out, step.arg, True) / "0")
        return [*checked, Metric("dry_job_status", status, "", "ok",
                                 status == "ok")], [" ".join(args)]
    directory = sweep_dir(ctx.out, step.arg, ctx.dry_run)
    stale = set_aside_stale(ctx, step, directory, engine_code.step_hash(step.name))
    directory.mkdir(parents=True, exist_ok=True)
    argv = sweep_argv(step, directory, ctx.dry_run)
    left = ctx.seconds_left()
    # In this process, after the step before: the engine it left is this sweep's to reuse.
    code = run_sweep(argv[3:], ctx.dir / "sweep.log",
                     None if left is None else max(1.0, left - GRACE_S))
    if code is None:
        raise Incomplete(f"{step.arg}: the sweep ran past the call's budget; rerun to go on "
                         "(finished jobs are skipped)")
    jobs = read_json(directory / SWEEP_SUMMARY, warn=True) or {}
    # Each job's run, captures and engine set-up, which the queue plans the step from (parts.py).
    parts.write_rows(ctx.dir / parts.JOBS_CSV, parts.sweep_rows(step.name, directory, list(jobs)))
    ok = sum(j["status"] in ("ok", "skipped") for j in jobs.values())
    errors = sorted({j["error"].splitlines()[0] for j in jobs.values() if j.get("error")})
    if code != 0 and not jobs:
        raise RuntimeError(f"sarathi_lab.run exited {code} before any job (see "
                           f"{ctx.dir.name}/sweep.log)")
    metrics = [*checked,
               Metric("jobs_ok", f"{ok}/{len(jobs)}", "", "all", bool(jobs) and ok == len(jobs)),
               Metric("sweep_exit", code, "", "0", code == 0)]
    return metrics, [" ".join(argv[2:]), *errors[:5], *filter(None, [stale])]
