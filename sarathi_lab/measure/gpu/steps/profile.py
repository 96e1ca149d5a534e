"""``task=profile`` for one model, through the harness, into <out>/profiles/<device>/."""
from __future__ import annotations

import os

from sarathi_lab.engine.tiles import GEMM_TILE
from sarathi_lab.measure.gpu.context import Context
from sarathi_lab.measure.gpu.engine_code import ENGINE, RUNS
from sarathi_lab.measure.gpu.state import Metric
from sarathi_lab.measure.gpu.steps import Declared

# One step per model (plan.PROFILES), made by the planner.
STEP = Declared(paths=(*ENGINE, *RUNS))


def overrides(model: str, dry_run: bool) -> list[str]:
    from sarathi_lab.measure.gpu.plan import PROFILE_SEQ_LEN  # the planner imports this module

    shape = (["model.name=tiny", "device=cpu", "dtype=float32", "chunk=32", "batch_size=2",
              "seq_len=64", "measure.tile=32", "measure.reps=1"] if dry_run else
             [f"model.name={model}", "device=cuda", "dtype=bfloat16", "chunk=512", "batch_size=18",
              f"seq_len={PROFILE_SEQ_LEN[model]}", f"measure.tile={GEMM_TILE}", "measure.reps=3"])
    return ["task=profile", *shape, "measure.token_step=16", "logger=none", "on_existing=overwrite"]


def run(ctx: Context, step) -> tuple[list[Metric], list[str]]:
    from sarathi_lab.harness.compose import run_in_process  # Hydra: only the steps that need it

    os.environ["SARATHI_PROFILES_DIR"] = str(ctx.out / "profiles")
    args = overrides(step.arg, ctx.dry_run)
    status = run_in_process(args, ctx.dir / "run")
    tables = sorted(str(p.relative_to(ctx.out)) for p in (ctx.out / "profiles").rglob("*.csv"))
    return [Metric("run_status", status, "", "ok", status == "ok")], \
        [" ".join(args), *(f"table: {t}" for t in tables)]
