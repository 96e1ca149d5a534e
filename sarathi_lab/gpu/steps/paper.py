"""A paper result's experiment as a Hydra sweep (``python -m sarathi_lab.run -m experiment=NAME``
with the overrides of its overlay ``experiment=gpu/NAME``) into <out>/paper/NAME/multiruns/, where
analysis.Results finds it.

The dry run cannot run the GPU shapes, so it validates every GPU job through the schema and plans
its KV cache on an 80 GB card, then runs one tiny job (``experiment=dry/NAME``) in-process;
SWEPT_IN_DRY_RUN's tiny job runs as a sweep in a child process, as on the GPU, so that path runs
too.
"""
from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

from sarathi_lab.config import REPO_ROOT
from sarathi_lab.engine.block_manager import blocks_for
from sarathi_lab.gpu import engine_code, state
from sarathi_lab.gpu.context import Context, Incomplete, wait_or_stop
from sarathi_lab.gpu.plan import Step
from sarathi_lab.gpu.state import Metric
from sarathi_lab.harness import scales
from sarathi_lab.harness.results import SWEEP_SUMMARY, read_json

GRACE_S = 10
# What the dry run plans each paper job's KV cache beside: the "80 GB" of the card's name, below the
# 85.5e9 bytes it totals (sim/devices/h100.yaml), for what a CUDA context and the allocator keep.
H100_BYTES = 80 * 10**9
SWEPT_IN_DRY_RUN = "per_token_cost"


def dry_job(step: Step) -> list[str]:
    return list(scales.overrides(step.arg, "dry"))


def sweep_dir(out: Path, name: str, dry_run: bool) -> Path:
    # analysis.Results labels a sweep whose folder starts with "ci-" as the quick scale.
    return out / "paper" / name / "multiruns" / ("ci-dry" if dry_run else "gpu")


def sweep_argv(step: Step, directory: Path, dry_run: bool = False) -> list[str]:
    overrides = dry_job(step) if dry_run else list(step.overrides)
    return [sys.executable, "-m", "sarathi_lab.run", "-m", f"experiment={step.arg}",
            f"hydra.sweep.dir={directory}", *overrides]


def job_overrides(step: Step) -> list[list[str]]:
    """Every job of the GPU sweep as plain overrides (the command line's swept values; the
    experiment's own sweeper axes that the command line leaves alone are not expanded)."""
    axes = [[f"{key}={v}" for v in values.split(",")]
            for key, values in (o.split("=", 1) for o in step.overrides)]
    return [[f"experiment={step.arg}", *job] for job in itertools.product(*axes)]


def check_gpu_jobs(step: Step) -> list[Metric]:
    """Each GPU job's overrides through the schema, and its batch's KV blocks against those the
    engine plans on an 80 GB card (model.memory.plan_kv_blocks, which refuses what does not fit
    beside the weights)."""
    import torch

    from sarathi_lab.harness.compose import compose_config
    from sarathi_lab.harness.schema import parse_config
    from sarathi_lab.model.memory import plan_kv_blocks
    from sarathi_lab.plan import ModelLimits, scheduler_config_of

    worst = 0.0
    jobs = job_overrides(step)
    for job in jobs:
        # Checked as a CPU job (EngineConfig refuses device=cuda where there is none), planned in
        # the job's own dtype on a CUDA device, as the GPU runs it.
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
    """A sweep an earlier call ran at other engine code (``now``: the code this call measures;
    stopped, or done and due again) moved into the step's folder: its finished jobs measured another
    engine, which the sweep would keep as done, so it starts over. Returns a note, or None where it
    resumes (or there is none)."""
    before = state.read_result(ctx.out, step.name)
    if before is None or not before.code or before.code == now or not directory.is_dir():
        return None
    stale = ctx.dir / f"stale_sweep_{before.code}"
    directory.rename(stale)
    return f"{step.arg}: the sweep run at engine code {before.code} starts over at {now} (set aside: {stale.name})"


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
    with open(ctx.dir / "sweep.log", "a") as log:
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        code = wait_or_stop(proc, None if left is None else max(1.0, left - GRACE_S), GRACE_S)
    if code is None:
        raise Incomplete(f"{step.arg}: the sweep ran past the call's budget; rerun to go on "
                         "(finished jobs are skipped)")
    jobs = read_json(directory / SWEEP_SUMMARY, warn=True) or {}
    ok = sum(j["status"] in ("ok", "skipped") for j in jobs.values())
    errors = sorted({j["error"].splitlines()[0] for j in jobs.values() if j.get("error")})
    if code != 0 and not jobs:
        raise RuntimeError(f"sarathi_lab.run exited {code} before any job (see "
                           f"{ctx.dir.name}/sweep.log)")
    return [*checked, Metric("jobs_ok", f"{ok}/{len(jobs)}", "", "all", bool(jobs)
                             and ok == len(jobs)),
            Metric("sweep_exit", code, "", "0", code == 0)], [" ".join(argv[2:]), *errors[:5],
                                                              *filter(None, [stale])]
