"""A finished run to W&B once its results are saved: never perturbs timings, never fails a run."""
from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sarathi_lab.harness.results import result_files
from sarathi_lab.harness.schema import LoggerCfg

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

log = logging.getLogger(__name__)

# So that W&B's summary never mixes a last-iteration value with a whole-run metric.
HISTORY_PREFIX = "iter/"
# The engine's clock: logged after the run, _runtime would put all iterations at one instant.
TIME_AXIS = f"{HISTORY_PREFIX}t_s"
# Where a run's numbers come from, in W&B's summary beside them.
PROVENANCE = ("timing_unreliable", "simulated", "executor", "device_name", "sarathi_lab_version",
              "git_commit", "git_dirty")
ENV_PREFIX = "env/"


@dataclass(frozen=True)
class WandbRun:
    run_dir: Path
    name: str
    group: str | None
    job_type: str
    tags: list[str]
    config: dict[str, Any]
    environment: dict[str, Any]         # into the config, PROVENANCE also into the summary
    summary: dict[str, Any]
    history: pd.DataFrame | pa.Table | None
    tables: dict[str, pd.DataFrame | pa.Table]


def resolve_mode(cfg: LoggerCfg) -> str:
    if cfg.mode != "auto":
        return cfg.mode
    keyed = os.environ.get("WANDB_API_KEY")
    return os.environ.get("WANDB_MODE") or ("online" if keyed else "offline")


def log_to_wandb(cfg: LoggerCfg, run: WandbRun) -> None:
    if cfg.kind == "none":
        return
    try:
        _log(cfg, run)
    except Exception as e:  # noqa: BLE001 - W&B never fails a run whose results are saved
        first_line = (str(e).strip().splitlines() or [""])[0]
        log.warning("W&B logging failed; the results in %s are complete: %s: %s",
                    run.run_dir, type(e).__name__, first_line)


def _log(cfg: LoggerCfg, run: WandbRun) -> None:
    import wandb  # import paid only by runs that log

    wb = wandb.init(
        project=cfg.project, entity=cfg.entity, dir=run.run_dir, mode=resolve_mode(cfg),
        name=run.name, group=run.group, job_type=run.job_type, tags=run.tags,
        config=run.config | {"environment": run.environment},
        settings=wandb.Settings(init_timeout=cfg.init_timeout_s, console="off",
                                x_disable_stats=True, silent=True),
    )
    exit_code = 1
    try:
        wb.define_metric(TIME_AXIS, summary="max")
        wb.define_metric(f"{HISTORY_PREFIX}*", step_metric=TIME_AXIS)
        history = [] if run.history is None else _scalar_columns(run.history).to_dict("records")
        for row in history:
            at = {TIME_AXIS: row["start_s"] + row["duration_s"]}
            wb.log(at | {f"{HISTORY_PREFIX}{k}": v for k, v in row.items()}, step=row["iteration"])
        last_step = history[-1]["iteration"] if history else 0
        wb.log({name: wandb.Table(dataframe=_scalar_columns(df))
                for name, df in run.tables.items()}, step=last_step)
        wb.summary.update(run.summary
                          | {f"{ENV_PREFIX}{k}": run.environment.get(k) for k in PROVENANCE})
        # The run's own files too (load_runs reads W&B's copy); copied: wb.save() warns for each.
        for path in result_files(run.run_dir):
            shutil.copy2(path, Path(wb.dir) / path.name)
        exit_code = 0
    finally:
        wb.finish(exit_code=exit_code)
    if exit_code == 0 and resolve_mode(cfg) == "offline":
        # Silent settings print nothing: we say where the offline run went and how to upload it.
        offline = Path(wb.dir).parent
        log.info("W&B run saved offline in %s; upload it with: wandb sync %s", offline, offline)


def _scalar_columns(df: pd.DataFrame | pa.Table) -> pd.DataFrame:
    import pandas as pd


    df = df if isinstance(df, pd.DataFrame) else df.to_pandas()
    # Lists fit neither a W&B table cell nor a history value; the parquet files keep them.
    return df[[c for c in df.columns
               if not df[c].map(lambda v: isinstance(v, (list, tuple, np.ndarray))).any()]]

