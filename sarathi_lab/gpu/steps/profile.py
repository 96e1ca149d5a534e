"""``task=profile`` (the simulator's per-iteration cost table) for one model, through the harness
as ``python -m sarathi_lab.run task=profile`` would run it, so the Hydra configs apply. Tables
land in <out>/profiles/<device>/ (SARATHI_PROFILES_DIR), for docs/gpu/<device>/ and profiles/."""
from __future__ import annotations

import importlib.util
import os

from sarathi_lab.config import ConfigError
from sarathi_lab.gpu.context import Context, Unavailable
from sarathi_lab.gpu.plan import PROFILE_SEQ_LEN
from sarathi_lab.gpu.state import Metric
from sarathi_lab.model.presets import PRESETS

TASK_MODULE = "sarathi_lab.harness.tasks.profile"


def overrides(model: str, dry_run: bool) -> list[str]:
    if dry_run:
        return ["task=profile", "model.name=tiny", "device=cpu", "dtype=float32", "chunk=32", "batch_size=2",
                "seq_len=64", "measure.token_step=16", "measure.tile=32", "measure.reps=1", "logger=none",
                "on_existing=overwrite"]
    return ["task=profile", f"model.name={model}", "device=cuda", "dtype=bfloat16", "chunk=512", "batch_size=18",
            f"seq_len={PROFILE_SEQ_LEN[model]}", "measure.token_step=16", "measure.tile=128", "measure.reps=3",
            "logger=none", "on_existing=overwrite"]


def available(model: str) -> None:
    try:
        found = importlib.util.find_spec(TASK_MODULE) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        raise Unavailable(f"task=profile is not in this checkout yet ({TASK_MODULE.replace('.', '/')}.py)")
    if model not in PRESETS:
        raise Unavailable(f"model preset {model!r} is not in this checkout yet (sarathi_lab/model/presets.py)")


def run(ctx: Context, step) -> tuple[list[Metric], list[str]]:
    available(step.arg)
    from sarathi_lab.harness.compose import run_in_process  # Hydra: only the steps that need it

    os.environ["SARATHI_PROFILES_DIR"] = str(ctx.out / "profiles")
    args = overrides(step.arg, ctx.dry_run)
    try:
        status = run_in_process(args, ctx.dir / "run")
    except ConfigError as e:
        if "task=" in str(e):
            raise Unavailable(f"task=profile is not registered in this checkout: {e}") from e
        raise
    tables = sorted(str(p.relative_to(ctx.out)) for p in (ctx.out / "profiles").rglob("*.csv"))
    return [Metric("run_status", status, "", "ok", status == "ok")], \
        [" ".join(args), *(f"table: {t}" for t in tables)]
