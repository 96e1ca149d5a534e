"""Every job of a sweep checked (preflighted, under the basic launcher) before the first runs: the
first refusal stops the sweep in one line, exit 2, before any sweep directory exists."""
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


def _is(node: Any, cls: type | str) -> bool:
    target = cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"
    return node is not None and str(node.get("_target_", "")) == target


# The project's sweeper: the basic sweeper's jobs less those collapse_ignored leaves out.
SWEEPER = "hydra_plugins.sarathi_lab_launcher.sweeper.Sweeper"


def _basic(config: DictConfig) -> bool:
    return _is(config.hydra.sweeper, BasicSweeper) or _is(config.hydra.sweeper, SWEEPER)


# More jobs than this are a search better split into sweeps (or a capacity task).
MAX_SWEEP_JOBS = 1000
PROGRESS_EVERY_S = 5.0


class SweepPreflight(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not _basic(config):
            return
        try:
            jobs, notes = swept_jobs(config)
        except ExcludeRefused as e:
            from sarathi_lab import cli_args

            cli_args.refuse(str(e))
        for note in notes:
            log.warning("%s", note)
        error = too_many_or_repeated(jobs)
        if error is None and _is(config.hydra.launcher, BasicLauncher):
            error = first_refused_job(config, jobs)
        if error:
            from sarathi_lab import cli_args

            # SystemExit passes Hydra's callback guard (which turns Exceptions into warnings).
            cli_args.refuse(error)


def job_overrides(config: DictConfig) -> list[list[str]]:
    """In the basic sweeper's order: hydra.sweeper.params, then the command line."""
    swept = config.hydra.sweeper.get("params") or {}
    params = [f"{key}={value}" for key, value in swept.items()]
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    overrides = parser.parse_overrides(params + list(config.hydra.overrides.task))
    return [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]


def swept_jobs(config: DictConfig) -> tuple[list[list[str]], list[str]]:
    """The jobs launched (under our sweeper: less those hydra.sweeper.exclude names, collapsed
    unless repeat_ignored), and notes."""
    jobs = job_overrides(config)
    if not _is(config.hydra.sweeper, SWEEPER):
        return jobs, []
    jobs, notes = without_excluded(config.hydra.sweeper.get("exclude"), jobs)
    if config.hydra.sweeper.get("repeat_ignored"):
        return jobs, notes
    jobs, more = collapse_ignored(config, jobs)
    return jobs, notes + more


class ExcludeRefused(ValueError):
    """A hydra.sweeper.exclude rule that is no mapping of swept keys to swept values."""


def without_excluded(rules: Any, jobs: list[list[str]]) -> tuple[list[list[str]], list[str]]:
    """``jobs`` less those matching a rule of ``rules`` (hydra.sweeper.exclude: a list of
    ``{key: value or [values]}``; a job matches a rule where, for each of its keys, the job's value
    is one of the rule's), and a note per rule; ExcludeRefused for a rule that could match no job
    (not a mapping, a key the sweep does not sweep, a value it does not take): a typo leaves out
    nothing, silently."""
    from sarathi_lab.harness.results import override_key

    if not rules:
        return jobs, []
    swept: dict[str, set[str]] = {}
    for job in jobs:
        for override in job:
            swept.setdefault(override_key(override), set()).add(override.split("=", 1)[1])
    swept = {key: values for key, values in swept.items() if len(values) > 1}
    parsed = [_rule(i, rule, swept) for i, rule in enumerate(_as_list(rules))]
    kept, notes = list(jobs), []
    for i, rule in enumerate(parsed):
        left = [job for job in kept if not _matches(rule, job)]
        shown = " ".join(f"{k}={','.join(sorted(v))}" for k, v in rule.items())
        notes.append(f"hydra.sweeper.exclude[{i}]: {len(kept) - len(left)} job"
                     f"{'s' * (len(kept) - len(left) != 1)} of {shown} left out")
        kept = left
    return kept, notes


def _as_list(rules: Any) -> list[Any]:
    from omegaconf import ListConfig, OmegaConf

    if isinstance(rules, ListConfig):
        rules = OmegaConf.to_container(rules, resolve=True)
    if not isinstance(rules, list):
        raise ExcludeRefused(f"hydra.sweeper.exclude={rules!r} is invalid: allowed: a list of "
                             "{key: value or [values]} naming the swept keys' values to leave out")
    return rules


def _rule(i: int, rule: Any, swept: dict[str, set[str]]) -> dict[str, set[str]]:
    from omegaconf import DictConfig, OmegaConf

    name = f"hydra.sweeper.exclude[{i}]"
    if isinstance(rule, DictConfig):
        rule = OmegaConf.to_container(rule, resolve=True)
    if not isinstance(rule, dict) or not rule:
        raise ExcludeRefused(f"{name}={rule!r} is invalid: allowed: a mapping of swept keys to "
                             f"a value or a list of values (swept: {', '.join(sorted(swept))})")
    out = {}
    for key, value in rule.items():
        values = {_text(v) for v in (value if isinstance(value, list) else [value])}
        if key not in swept:
            raise ExcludeRefused(f"{name}.{key} is invalid: {key} is not swept here; allowed: "
                                 f"{', '.join(sorted(swept)) or 'none (nothing is swept)'}")
        if not values or values - swept[key]:
            raise ExcludeRefused(f"{name}.{key}={value!r} is invalid: the sweep's {key} takes "
                                 f"{', '.join(sorted(swept[key]))}")
        out[key] = values
    return out


def _text(value: Any) -> str:
    """A YAML value as the command line spells it (``true``, not ``True``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _matches(rule: dict[str, set[str]], job: list[str]) -> bool:
    from sarathi_lab.harness.results import override_key

    values = {override_key(o): o.split("=", 1)[1] for o in job}
    return all(values.get(key) in allowed for key, allowed in rule.items())


def collapse_ignored(config: DictConfig,
                     jobs: list[list[str]]) -> tuple[list[list[str]], list[str]]:
    """Jobs differing from an earlier one only in keys they ignore left out (``chunk=256,512
    scheduler=vllm,sarathi`` runs vllm once); refused ones kept for the preflight."""
    from sarathi_lab.config import ConfigError
    from sarathi_lab.harness.results import override_key
    from sarathi_lab.model import ModelLoadError

    values: dict[str, set[str]] = {}
    for overrides in jobs:
        for override in overrides:
            values.setdefault(override_key(override), set()).add(override)
    # The keys a job may ignore: a scheduler's knobs, and the budget some schedulers do not read.
    swept = [key for key, seen in values.items() if len(seen) > 1
             and (key in ("chunk", "token_budget") or key.startswith("scheduler."))]
    if not swept:
        return jobs, []
    loader = GlobalHydra.instance().config_loader()
    kept: list[list[str]] = []
    first: dict[tuple, list[str]] = {}
    left_out: dict[tuple[str, str], list[tuple[list[str], list[str]]]] = {}
    for overrides in jobs:
        try:
            run = _job_config(loader, config, overrides)
        except (ConfigError, ModelLoadError):
            kept.append(overrides)
            continue
        ignored = {key: why for key in swept if (why := run.ignores(key))}
        same = (tuple(sorted(o for o in overrides if override_key(o) not in ignored)),
                tuple(sorted(ignored)))
        if same in first:
            for key, why in ignored.items():
                left_out.setdefault((key, why), []).append((overrides, first[same]))
            continue
        first[same] = overrides
        kept.append(overrides)
    notes = []
    for (key, why), dropped in left_out.items():
        ran = sorted({o for _, kept_job in dropped for o in kept_job if override_key(o) == key})
        notes.append(f"{key}: {why}: {len(dropped)} job{'s' * (len(dropped) > 1)} that differed "
                     f"only in {key} left out, run once at {', '.join(ran)}; "
                     "hydra.sweeper.repeat_ignored=true runs each")
    return kept, notes


def too_many_or_repeated(jobs: list[list[str]]) -> str | None:
    if len(jobs) > MAX_SWEEP_JOBS:
        return (f"the sweep has {len(jobs)} jobs, more than the {MAX_SWEEP_JOBS} one sweep may "
                "run; split it into several sweeps (or search a rate with task=capacity); no job "
                "was run")
    seen: dict[tuple[str, ...], int] = {}
    for num, overrides in enumerate(jobs):
        key = tuple(sorted(overrides))
        if key in seen:
            return (f"sweep jobs {seen[key]} and {num} are the same ({' '.join(overrides)}): a "
                    "value is repeated in a sweep; each job must differ; no job was run")
        seen[key] = num
    return None


def first_refused_job(config: DictConfig, jobs: list[list[str]]) -> str | None:
    from sarathi_lab.config import ConfigError
    from sarathi_lab.harness.preflight import preflight
    from sarathi_lab.model import ModelLoadError

    loader = GlobalHydra.instance().config_loader()
    said = time.monotonic()
    for num, overrides in enumerate(jobs):
        if time.monotonic() - said > PROGRESS_EVERY_S:
            log.info("checked %d of %d sweep jobs before running any", num, len(jobs))
            said = time.monotonic()
        try:
            preflight(_job_config(loader, config, overrides))
        except (ConfigError, ModelLoadError) as e:
            return f"sweep job {num} of {len(jobs)} ({' '.join(overrides)}): {e}; no job was run"
    return None


def job_config(config: DictConfig, overrides: list[str]):
    """The job's RunConfig, parsed once a sweep; a refusal raised (ConfigError, ModelLoadError)."""
    return _job_config(GlobalHydra.instance().config_loader(), config, overrides)


# Each job's typed config or refusal, parsed once for the checks and the collapse.
_PARSED: dict[str, Any] = {"loader": None, "jobs": {}}


def composed(loader, overrides: list[str]) -> bool:
    """Whether the preflight composed this job with ``loader`` (its config parsed or refused)."""
    return _PARSED["loader"] is loader and tuple(overrides) in _PARSED["jobs"]


def _job_config(loader, config: DictConfig, overrides: list[str]):
    from sarathi_lab.config import ConfigError
    from sarathi_lab.harness.schema import parse_config
    from sarathi_lab.model import ModelLoadError

    if _PARSED["loader"] is not loader:
        _PARSED.update(loader=loader, jobs={})
    jobs, key = _PARSED["jobs"], tuple(overrides)
    if key not in jobs:
        job = loader.load_sweep_config(config, list(overrides))
        with read_write(job), open_dict(job):
            del job["hydra"]
        try:
            jobs[key] = parse_config(job)
        except (ConfigError, ModelLoadError) as e:
            jobs[key] = e
    if isinstance(jobs[key], Exception):
        raise jobs[key]
    return jobs[key]
