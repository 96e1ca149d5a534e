"""A run to W&B: opened as it starts, written once its results are saved; never fails a run."""
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


@dataclass(frozen=True)
class WandbName:
    """What W&B files a run under, known before it runs."""
    run_dir: Path
    name: str
    group: str | None
    job_type: str
    tags: list[str]
    config: dict[str, Any]


def resolve_mode(cfg: LoggerCfg) -> str:
    if cfg.mode != "auto":
        return cfg.mode
    keyed = os.environ.get("WANDB_API_KEY")
    return os.environ.get("WANDB_MODE") or ("online" if keyed else "offline")


class WandbSession:
    """A W&B run opened as its run starts: W&B counts _runtime from its run's start, which no
    setting moves, so a run opened after the work would last the logging's second. Nothing is
    logged until the work has ended; W&B's service idles meanwhile (no system metrics, no console
    capture), as it does through a sweep's later jobs once the first has logged."""

    def __init__(self, cfg: LoggerCfg, name: WandbName | None = None):
        """``name`` None: the run is opened when it is logged."""
        self.cfg = cfg
        self.run_dir = name.run_dir if name else None
        self._wb = None
        self._failed = False    # said once, in one warning
        if cfg.kind == "none" or name is None:
            return
        try:
            self._wb = _init(cfg, name)
        except Exception as e:  # noqa: BLE001 - W&B never fails a run
            self._failed = True
            _warn(name.run_dir, e)

    def log(self, run: WandbRun) -> None:
        """Writes the finished run and closes it; opens it now where it could not be opened."""
        if self.cfg.kind == "none" or self._failed:
            return
        try:
            wb, self._wb = self._wb or _init(self.cfg, WandbName(
                run.run_dir, run.name, run.group, run.job_type, run.tags, run.config)), None
            _write(wb, run, self.cfg)
        except Exception as e:  # noqa: BLE001 - W&B never fails a run whose results are saved
            _warn(run.run_dir, e)

    def abandon(self) -> None:
        """The run ended without results: its W&B run is marked failed (exit 1), nothing logged."""
        wb, self._wb = self._wb, None
        if wb is not None:
            try:
                wb.finish(exit_code=1)
            except Exception as e:  # noqa: BLE001
                _warn(self.run_dir, e)


def log_to_wandb(cfg: LoggerCfg, run: WandbRun) -> None:
    """A run opened and written at once (a capacity search's trials, logged as each ends)."""
    WandbSession(cfg).log(run)


def sweep_group(name: str, sweep_dir: Path) -> str:
    """The W&B group of a sweep's runs and of its report."""
    return f"{name}-{Path(sweep_dir).name}"


# The sweep's own W&B run: its report beside its jobs' runs, in their group.
SWEEP_JOB_TYPE = "sweep"
SWEEP_TABLE_KEY = "sweep_summary"
FIGURE_PREFIX = "figure/"


def log_sweep(cfg: LoggerCfg, sweep_dir: Path, name: str, group: str, table: pd.DataFrame,
              figures: dict[str, Path], duration_s: float) -> None:
    """The sweep's table (sweep_summary.csv) as a W&B table and its figures as W&B images, in a
    run of the sweep's group; its summary says how many jobs ended how, and how long this launch
    took (``sweep_duration_s``; its own _runtime is the logging's: one W&B run open through the
    sweep would end each job's, as a process holds one run at a time)."""
    if cfg.kind == "none":
        return
    try:
        import wandb

        counts = table.status.value_counts().to_dict() if "status" in table else {}
        wb = _init(cfg, WandbName(run_dir=sweep_dir, name=f"{name} sweep {Path(sweep_dir).name}",
                                  group=group, job_type=SWEEP_JOB_TYPE, tags=[name, SWEEP_JOB_TYPE],
                                  config={"name": name, "sweep_dir": str(sweep_dir)}))
        exit_code = 1
        try:
            wb.log({SWEEP_TABLE_KEY: wandb.Table(dataframe=_table_cells(table)),
                    **{f"{FIGURE_PREFIX}{key}": wandb.Image(str(path))
                       for key, path in figures.items()}})
            wb.summary.update({"jobs": len(table), "sweep_duration_s": duration_s,
                               **{f"jobs_{k}": int(v) for k, v in counts.items()}})
            exit_code = 0
        finally:
            wb.finish(exit_code=exit_code)
        if resolve_mode(cfg) == "offline":
            log.info("the sweep's table and %d figure%s in W&B's group %s, saved offline in %s",
                     len(figures), "s" * (len(figures) != 1), group, Path(wb.dir).parent)
    except Exception as e:  # noqa: BLE001 - W&B never fails a sweep whose report is saved
        _warn(sweep_dir, e)


def _table_cells(table: pd.DataFrame) -> pd.DataFrame:
    """A W&B table's column holds one type: a column of numbers and None as floats and NaN."""
    import pandas as pd

    out = table.copy()
    for column in out.columns:
        numbers = pd.to_numeric(out[column], errors="coerce")
        if out[column].notna().sum() and numbers.notna().sum() == out[column].notna().sum() \
                and out[column].map(lambda v: not isinstance(v, bool)).all():
            out[column] = numbers.astype(float)
        else:
            out[column] = out[column].map(lambda v: None if v is None else str(v))
    return out


def _warn(run_dir: Path | None, e: Exception) -> None:
    first_line = (str(e).strip().splitlines() or [""])[0]
    log.warning("W&B logging failed; the results in %s are complete: %s: %s",
                run_dir, type(e).__name__, first_line)


def _init(cfg: LoggerCfg, name: WandbName):
    import wandb  # import paid only by runs that log

    # Absolute: W&B's service writes the run's .wandb file, and it can be another process's, in
    # another working directory (WANDB_SERVICE, which W&B hands to child processes: a sweep started
    # from a notebook or a test that used W&B), where a sweep's relative folder is elsewhere.
    return wandb.init(
        project=cfg.project, entity=cfg.entity, dir=Path(name.run_dir).absolute(),
        mode=resolve_mode(cfg),
        name=name.name, group=name.group, job_type=name.job_type, tags=name.tags,
        config=name.config,
        settings=wandb.Settings(init_timeout=cfg.init_timeout_s, console="off",
                                x_disable_stats=True, silent=True),
    )


def _write(wb, run: WandbRun, cfg: LoggerCfg) -> None:
    import wandb

    exit_code = 1
    try:
        wb.config.update({"environment": run.environment}, allow_val_change=True)
        # The iterations are a series, not a result: no last-iteration value in the summary.
        wb.define_metric(TIME_AXIS, summary="none")
        wb.define_metric(f"{HISTORY_PREFIX}*", step_metric=TIME_AXIS, summary="none")
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
    if resolve_mode(cfg) == "offline":
        # Silent settings print nothing: we say where the offline run went and how to upload it.
        offline = Path(wb.dir).parent
        log.info("W&B run saved offline in %s; upload it with: wandb sync %s", offline, offline)


def _scalar_columns(df: pd.DataFrame | pa.Table) -> pd.DataFrame:
    import pandas as pd


    df = df if isinstance(df, pd.DataFrame) else df.to_pandas()
    # Lists fit neither a W&B table cell nor a history value; the parquet files keep them.
    return df[[c for c in df.columns
               if not df[c].map(lambda v: isinstance(v, (list, tuple, np.ndarray))).any()]]

