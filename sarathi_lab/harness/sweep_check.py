"""Every job of a sweep checked before the first one runs (experiments/README.md): too many jobs or
repeated ones under any launcher; under the basic launcher, which runs the jobs here one after another,
each job's config composed, parsed and preflighted as the job will do it. The first refusal stops the
sweep with one line naming the job, and exit 2, before any sweep directory exists.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from hydra._internal.core_plugins.basic_launcher import BasicLauncher
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, open_dict, read_write

log = logging.getLogger(__name__)


def _is(node: Any, cls: type) -> bool:
    """Whether the hydra.sweeper / hydra.launcher node ``node`` instantiates ``cls``."""
    return node is not None and str(node.get("_target_", "")) == f"{cls.__module__}.{cls.__qualname__}"


# The most jobs one sweep may have: more is a search better split into sweeps (or a capacity task).
MAX_SWEEP_JOBS = 1000
PROGRESS_EVERY_S = 5.0


class SweepPreflight(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not _is(config.hydra.sweeper, BasicSweeper):
            return
        jobs = job_overrides(config)
        error = too_many_or_repeated(jobs)
        if error is None and _is(config.hydra.launcher, BasicLauncher):
            error = first_refused_job(config, jobs)
        if error:
            from sarathi_lab import cli_args

            # README's one `error:` line and exit 2, as a refused single run; SystemExit passes Hydra's
            # callback guard (which turns Exceptions into warnings).
            cli_args.refuse(error)


def job_overrides(config: DictConfig) -> list[list[str]]:
    """Each job's overrides, in the basic sweeper's order: hydra.sweeper.params, then the command line."""
    params = [f"{key}={value}" for key, value in (config.hydra.sweeper.get("params") or {}).items()]
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    overrides = parser.parse_overrides(params + list(config.hydra.overrides.task))
    return [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]


def planned_jobs(config: DictConfig) -> int | None:
    """How many jobs the sweep launches, or None under a sweeper other than the basic one."""
    return len(job_overrides(config)) if _is(config.hydra.sweeper, BasicSweeper) else None


def too_many_or_repeated(jobs: list[list[str]]) -> str | None:
    """The one-line error for a sweep of more than MAX_SWEEP_JOBS jobs or with two equal jobs, or None."""
    if len(jobs) > MAX_SWEEP_JOBS:
        return (f"the sweep has {len(jobs)} jobs, more than the {MAX_SWEEP_JOBS} one sweep may run; split it "
                "into several sweeps (or search a rate with task=capacity); no job was run")
    seen: dict[tuple[str, ...], int] = {}
    for num, overrides in enumerate(jobs):
        key = tuple(sorted(overrides))
        if key in seen:
            return (f"sweep jobs {seen[key]} and {num} are the same ({' '.join(overrides)}): a value is repeated "
                    "in a sweep; each job must differ; no job was run")
        seen[key] = num
    return None


def first_refused_job(config: DictConfig, jobs: list[list[str]]) -> str | None:
    """The one-line error of the first job whose config the run would refuse, or None."""
    from sarathi_lab.config import ConfigError
    from sarathi_lab.harness.preflight import preflight
    from sarathi_lab.harness.schema import parse_config
    from sarathi_lab.model import ModelLoadError

    loader = GlobalHydra.instance().config_loader()
    said = time.monotonic()
    for num, overrides in enumerate(jobs):
        if time.monotonic() - said > PROGRESS_EVERY_S:
            log.info("checked %d of %d sweep jobs before running any", num, len(jobs))
            said = time.monotonic()
        job = loader.load_sweep_config(config, list(overrides))
        with read_write(job), open_dict(job):
            del job["hydra"]
        try:
            preflight(parse_config(job))
        except (ConfigError, ModelLoadError) as e:
            return f"sweep job {num} of {len(jobs)} ({' '.join(overrides)}): {e}; no job was run"
    return None
