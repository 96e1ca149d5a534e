"""End-of-sweep report, a Hydra callback run by the launching process (a failed job: exit 1), and
an earlier launch's job folders set aside."""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from sarathi_lab import provenance
from sarathi_lab.executors import recorded_as
from sarathi_lab.harness import sweep_eta, sweep_resume, sweep_sim_eta, sweep_state
from sarathi_lab.harness.job_dirs import RESOLVER, job_dir_name
from sarathi_lab.harness.results import (
    METRICS,
    STATUS,
    SWEEP_SUMMARY,
    SWEEP_TABLE,
    WANDB_DIR,
    is_finished,
    natural_order,
    next_dir,
    override_key,
    read_json,
    read_status,
    run_source,
    write_json,
)
from sarathi_lab.harness.sweep_check import _basic, job_config, swept_jobs
from sarathi_lab.host_load import UNRELIABLE_WAIT_SHARE

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)
# A rerun sweep's stale job folders go aside into STALE/<when>/, never read as its own.
STALE = ".stale"
_SUCCESS = ("ok", "skipped")
# How far to trust each row: its numbers' source, timings stretched by other work, its KV cache.
TRUST = ("source", "timing_unreliable", "runqueue_wait_share", "kv_capacity_tokens")
HEADLINE = ("request_throughput_rps", "total_throughput_tok_s", "ttft_p50_s", "itl_p99_s",
            "e2el_p50_s", "goodput_rps", "capacity_rps")


class SweepSummary(Callback):
    def __init__(self) -> None:
        self._start = time.time()
        self._lock: int | None = None
        self._clock: sweep_eta.SweepClock | None = None
        self._job_start = time.monotonic()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._start = time.time()
        jobs = swept_jobs(config)[0] if _basic(config) else None
        try:
            count = None if jobs is None else len(jobs)
            self._lock = sweep_state.hold(Path(config.hydra.sweep.dir), count)
        except sweep_state.SweepDirInUse as e:
            from sarathi_lab import cli_args

            # SystemExit passes Hydra's callback guard, which would let the sweep run unlocked.
            cli_args.refuse(str(e))
        # Held: no other sweep writes there now; an earlier launch's jobs go.
        names = None if jobs is None else expected_job_dirs(config, jobs)
        if names is not None:
            move_stale(Path(config.hydra.sweep.dir), set(names))
        sweep_resume.sweep_started(config)
        if jobs is not None:
            self._clock = _clock(config, jobs, names)
            for line in self._clock.before():
                (log.warning if "over an hour" in line else log.info)("%s", line)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._job_start = time.monotonic()

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        """Each job's time, kept for later sweeps' estimates; with the launcher's clock (the basic
        launcher runs jobs in its own process), the sweep's progress."""
        from hydra.types import RunMode

        if config.hydra.mode != RunMode.MULTIRUN:
            return
        seconds = time.monotonic() - self._job_start
        out = Path(str(config.hydra.runtime.output_dir))
        status = max(filter(None, (read_status(out), read_status(next_dir(out)))),
                     key=lambda s: s["time"], default={})
        num = int(config.hydra.job.num)
        clock = self._clock if self._clock is not None and num < len(self._clock.jobs) else None
        setup_s = min(_setup_seconds(out), seconds)
        if status.get("status") == "ok":
            with contextlib.suppress(OSError):
                sweep_eta.record(Path(str(config.hydra.sweep.dir)),
                                 clock.jobs[num] if clock else _job_of(config), seconds, setup_s)
        if clock is not None:
            log.info("%s", clock.job_ended(num, seconds, setup_s))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            self._report(Path(config.hydra.sweep.dir), config)
        finally:
            if self._lock is not None:
                os.close(self._lock)
                self._lock = None

    def _report(self, sweep_dir: Path, config: DictConfig | None = None) -> None:
        jobs = summarize_sweep(sweep_dir, since=self._start)
        move_stale(sweep_dir, set(jobs))
        summary, table_path = sweep_dir / SWEEP_SUMMARY, sweep_dir / SWEEP_TABLE
        if summary.exists() and _left_every_job_as_it_was(sweep_dir, jobs, self._start):
            # A rerun that changed none of the finished sweep's runs must not replace its report.
            summary = sweep_dir / sweep_state.NEXT_SUMMARY
            table_path = sweep_dir / f".{Path(SWEEP_TABLE).stem}.next.csv"
            log.info("every job of the finished sweep was left as it was; "
                     "this rerun's report is %s", summary)
        write_json(summary, jobs)
        table = sweep_table(sweep_dir, jobs)
        table.to_csv(table_path, index=False)
        if len(table):
            # Jobs by number: the swept columns show their overrides.
            short = table.assign(job=table.job.str.split("_", n=1).str[0])
            shown = short.to_string(index=False, float_format=lambda v: f"{v:.4g}")
            log.info("sweep %s:\n%s", table_path, shown)
            for note in [*table_notes(table), *filter(None, [mixed_commits(sweep_dir, jobs)])]:
                log.warning("%s", note)
            if config is not None:
                self._publish(config, sweep_dir, table)
        failed = {d: j for d, j in jobs.items() if j["status"] not in _SUCCESS}
        log.info("sweep %s: %d jobs, %d failed", sweep_dir, len(jobs), len(failed))
        for job_dir, job in failed.items():
            log.error("FAILED %s (%s): %s", job_dir, job["status"], job["error"])
        if failed:
            # SystemExit passes Hydra's callback guard (which turns Exceptions into warnings).
            sys.exit(1)


    def _publish(self, config: DictConfig, sweep_dir: Path, table: pd.DataFrame) -> None:
        """The sweep as one view in W&B: its table and figures, a run of the sweep's group."""
        from sarathi_lab.harness.schema import LoggerCfg
        from sarathi_lab.harness.wandb_logger import log_sweep, sweep_group

        logger = LoggerCfg(**OmegaConf.to_container(config.logger, resolve=True))
        if logger.kind == "none":
            return
        name = str(config.get("name", "run"))
        try:
            drawn = self.figures(name, sweep_dir, table)
        except Exception as e:  # noqa: BLE001 - a figure never fails a sweep whose runs are saved
            log.warning("no figure of sweep %s: %s: %s", sweep_dir, type(e).__name__, e)
            drawn = {}
        log_sweep(logger, sweep_dir, name, sweep_group(name, sweep_dir), table, drawn,
                  duration_s=time.time() - self._start)

    def figures(self, name: str, sweep_dir: Path, table: pd.DataFrame) -> dict[str, Path]:
        """{W&B key: PNG}; none here: sarathi_lab/sweep_report.py draws them, above the analysis."""
        return {}


def summarize_sweep(sweep_dir: Path, since: float) -> dict[str, dict[str, Any]]:
    """{job dir: {status, error}} of the jobs started at or after `since`."""
    jobs = {}
    # A job killed before it saved its config has only the status.json its launcher wrote.
    job_dirs = {_job_dir(p.parent) for pattern in ("**/.hydra", f"**/{STATUS}")
                for p in sweep_dir.glob(pattern) if STALE not in p.relative_to(sweep_dir).parts}
    for job_dir in sorted(job_dirs, key=natural_order):
        config = job_dir / ".hydra" / "config.yaml"
        # A status written since the sweep began is this sweep's, even beside an earlier .hydra/.
        statuses = [s for s in (read_status(job_dir), read_status(next_dir(job_dir)))
                    if s and s["time"] >= since - 1]
        status = max(statuses, key=lambda s: s["time"]) if statuses else None
        if status is None:
            if not config.exists() or config.stat().st_mtime < since - 1:
                continue
            status = {"status": "unknown",
                      "error": "the job left no status: killed before it started?"}
        elif status["status"] == "running":
            status = {"status": "killed",
                      "error": "the job never finished nor reported an error "
                               "(killed by a signal, the OOM killer or a time limit?)"}
        jobs[str(job_dir.relative_to(sweep_dir))] = {"status": status["status"],
                                                     "error": status.get("error")}
    return jobs


def _left_every_job_as_it_was(sweep_dir: Path, jobs: dict[str, dict[str, Any]],
                              since: float) -> bool:
    """Every job recorded itself beside a finished run (.<job>.next/) and none replaced it."""
    return all((s := read_status(next_dir(sweep_dir / job))) and s["time"] >= since - 1
               and (read_status(sweep_dir / job) or {"time": 0})["time"] < s["time"]
               for job in jobs)


def _job_dir(path: Path) -> Path:
    if path.name.startswith(".") and path.name.endswith(".next"):
        return path.with_name(path.name[1:-len(".next")])
    return path


def sweep_table(sweep_dir: Path, jobs: dict[str, dict[str, Any]]) -> pd.DataFrame:
    rows = []
    for job, outcome in jobs.items():
        record = read_json(sweep_dir / job / METRICS)
        overrides = record["overrides"] if record else _unfinished_overrides(sweep_dir, job)
        values = {override_key(o): o.split("=", 1)[1] for o in overrides if "=" in o}
        summary = (record or {}).get("summary", {})
        rows.append({"job": job, "status": outcome["status"], **values, **_trust(record),
                     **{k: summary[k] for k in HEADLINE if summary.get(k) is not None}})
    # Imported here: only a sweep's end needs it.
    import pandas as pd

    table = pd.DataFrame(rows)
    if table.empty:
        return table
    fixed = ("job", "status", *TRUST, *HEADLINE)
    swept = [k for k in table.columns if k not in fixed and table[k].nunique() > 1]
    return table[["job", "status", *swept, *[k for k in (*TRUST, *HEADLINE) if k in table]]]


def _trust(record: dict[str, Any] | None) -> dict[str, Any]:
    """A simulated run's times come from a virtual clock: the host's waits say nothing of them."""
    if not isinstance(record, dict) or not isinstance(record.get("environment"), dict):
        return {}
    env, summary = record["environment"], record.get("summary") or {}
    source = run_source(env, env.get("device"))
    measured = not recorded_as(env.get("executor"), "simulated")
    return {"source": source,
            "timing_unreliable": bool(env.get("timing_unreliable")) if measured else False,
            "runqueue_wait_share": env.get("runqueue_wait_share") if measured else None,
            "kv_capacity_tokens": summary.get("kv_capacity_tokens")}


def table_notes(table: pd.DataFrame) -> list[str]:
    notes = []
    if "timing_unreliable" in table and (flagged := table.timing_unreliable.eq(True)).any():
        shares = table.runqueue_wait_share[flagged].dropna()
        low, high = shares.min(), shares.max()
        span = f"{low:.0%}" + (f" to {high:.0%}" if high > low else "")
        waited = (f"; their threads waited for a CPU {span} of the time they were ready"
                  if len(shares) else "")
        notes.append(f"timing unreliable: {flagged.sum()} of {table.source.notna().sum()} runs "
                     f"(above {UNRELIABLE_WAIT_SHARE:.0%} waiting{waited}): other work on the "
                     "machine stretched their times; rerun them on a quiet machine before "
                     "comparing them")
    kv = table.kv_capacity_tokens.dropna() if "kv_capacity_tokens" in table else None
    if kv is not None and kv.nunique() > 1:
        # Two digits read "1x" for caches a few blocks apart: those say how far apart.
        apart = (f"{kv.max() / kv.min():.2g}x" if kv.max() >= 1.1 * kv.min()
                 else f"{kv.max() / kv.min() - 1:.1%} apart, {kv.max() - kv.min():.0f} tokens")
        notes.append(f"KV capacity differs between jobs: {kv.min():.0f} to {kv.max():.0f} tokens "
                     f"({apart}; column kv_capacity_tokens): under memory pressure their "
                     "batches and preemptions differ for that alone; engine.num_kv_blocks=N "
                     "gives every job one size")
    if "source" in table and table.source.nunique() > 1:
        sources = table.source.dropna().unique()
        # Engines side by side are the comparison asked for; a prediction beside a measurement not.
        why = ("measured on different engines: compare them as engines, at the same settings"
               if all(str(s).startswith("measured") for s in sources)
               else "measured and predicted numbers are not comparable as they stand")
        notes.append(f"the rows come from different sources ({', '.join(sources)}): {why}")
    return notes


def mixed_commits(sweep_dir: Path, jobs: dict[str, dict[str, Any]]) -> str | None:
    """The commits a resumed sweep's runs ran at, each with its jobs' count; None where one."""
    found: dict[str, int] = {}
    for job in jobs:
        record = read_json(sweep_dir / job / METRICS)
        env = record.get("environment") if isinstance(record, dict) else None
        if isinstance(env, dict):
            commit = provenance.commits([env.get("git_commit")])
            found[commit] = found.get(commit, 0) + 1
    if len(found) < 2:
        return None
    each = ", ".join(f"{commit} ({n} job{'s' * (n != 1)})" for commit, n in sorted(found.items()))
    return (f"the runs come from {len(found)} commits: {each}; the code changed between them "
            "(a resumed sweep): rerun the older jobs (on_existing=overwrite) before comparing them")


def _unfinished_overrides(sweep_dir: Path, job: str) -> list[str]:
    """Saved once its checks passed, else those its folder's name spells."""
    named = job.split("_", 1)[1].split(",") if "_" in job else []
    for where in (sweep_dir / job, next_dir(sweep_dir / job)):
        try:
            saved = yaml.safe_load((where / ".hydra" / "overrides.yaml").read_text())
            return list(saved or []) or named
        except (OSError, yaml.YAMLError):
            continue
    return named


def expected_job_dirs(config: DictConfig, jobs: list[list[str]]) -> list[str] | None:
    """The folders ``jobs`` get, in order; None where hydra.sweep.subdir is not NUM_overrides."""
    from hydra._internal.config_loader_impl import get_overrides_dirname
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    subdir = OmegaConf.to_container(config.hydra.sweep, resolve=False).get("subdir")
    if RESOLVER not in str(subdir):
        return None
    naming = config.hydra.job.config.override_dirname
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    return [job_dir_name(num, get_overrides_dirname(parser.parse_overrides(list(overrides)),
                                                    list(naming.exclude_keys),
                                                    naming.item_sep, naming.kv_sep))
            for num, overrides in enumerate(jobs)]


def _clock(config: DictConfig, jobs: list[list[str]],
           names: list[str] | None) -> sweep_eta.SweepClock:
    """A job whose folder holds a finished run is kept (unless on_existing=overwrite): no time."""
    from sarathi_lab.config import ConfigError
    from sarathi_lab.model import ModelLoadError

    sweep_dir = Path(config.hydra.sweep.dir)
    planned, cfgs = [], []
    for num, overrides in enumerate(jobs):
        try:
            cfg = job_config(config, overrides)
        except (ConfigError, ModelLoadError):
            cfg = None
        kept = (names is not None and cfg is not None and cfg.on_existing != "overwrite"
                and is_finished(sweep_dir / names[num]))
        planned.append(sweep_eta.job(overrides, cfg, kept))
        cfgs.append(cfg)
    past = sweep_eta.past_jobs(sweep_dir)
    planned, no_simulation = sweep_sim_eta.simulated(config, jobs, planned, cfgs, past)
    return sweep_eta.SweepClock(planned, past, no_simulation)


def _setup_seconds(run_dir: Path) -> float:
    """The seconds a finished run spent building the engine's parts, from its results; 0 where
    it built none (it took them from the sweep's earlier job) or recorded none."""
    try:
        setup = json.loads((run_dir / "metrics.json").read_text())["environment"]["engine_setup"]
        seconds = float(setup["seconds"])
        built = "built" in dict(setup.get("parts") or {}).values()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return 0.0
    return seconds if built and math.isfinite(seconds) and seconds > 0 else 0.0


def _job_of(config: DictConfig) -> sweep_eta.Job:
    """A job run in a process of its own (submitit, Ray), as the clock would have planned it."""
    from omegaconf import open_dict, read_write

    from sarathi_lab.config import ConfigError
    from sarathi_lab.harness.schema import parse_config
    from sarathi_lab.model import ModelLoadError

    job = config.copy()
    with read_write(job), open_dict(job):
        del job["hydra"]
    try:
        cfg = parse_config(job)
    except (ConfigError, ModelLoadError):
        cfg = None
    return sweep_eta.job(list(config.hydra.overrides.task), cfg)


def job_folders(sweep_dir: Path) -> list[str]:
    if not sweep_dir.is_dir():
        return []
    return [p.name for p in sorted(sweep_dir.iterdir(), key=natural_order)
            if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
            and p.name != WANDB_DIR
            and any((p / name).exists() for name in (STATUS, METRICS, ".hydra"))]


def move_stale(sweep_dir: Path, current: set[str]) -> list[str]:
    stale = [job for job in job_folders(sweep_dir) if job not in current]
    if not stale:
        return []
    aside = sweep_dir / STALE / time.strftime("%Y-%m-%d_%H-%M-%S")
    aside.mkdir(parents=True, exist_ok=True)
    for job in stale:
        for folder in (sweep_dir / job, next_dir(sweep_dir / job)):
            if folder.exists():
                folder.rename(aside / folder.name)
    shown = ", ".join(stale[:8]) + (f" and {len(stale) - 8} more" if len(stale) > 8 else "")
    log.warning("%d job folder%s of an earlier launch into %s %s none of this sweep's jobs "
                "(its swept values changed): moved aside into %s, where no reader reads them: %s",
                len(stale), "s" * (len(stale) != 1), sweep_dir,
                "is" if len(stale) == 1 else "are", aside, shown)
    return stale
