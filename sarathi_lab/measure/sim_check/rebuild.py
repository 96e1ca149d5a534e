"""A measured run's simulated twin, built from the configuration the run recorded (metrics.json's
``resolved_config``), not from its command line composed over today's experiment configs: a default
changed since (an experiment's batch or KV cache, the scheduler's chunk alignment) cannot change
what is rebuilt. A key renamed since is read under today's name (``_MOVED``); a key that no longer
exists, or a value no longer allowed, is refused in one line naming the run and the key."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sarathi_lab.config import ConfigError
from sarathi_lab.engine.scheduler.base import knob_owners
from sarathi_lab.harness import CONF_DIR
from sarathi_lab.harness.compose import compose_config, run_composed
from sarathi_lab.harness.results import METRICS, override_key, read_record
from sarathi_lab.harness.schema import parse_config

# What a simulated rebuild sets itself (or must not inherit): each command-line key, and where the
# resolved config holds what it set.
_NOT_CARRIED = {"executor": "engine.executor", "engine.sim_device": "engine.sim_device",
                "engine.sim_cost_model": "engine.sim_cost_model", "logger": "logger",
                "on_existing": "on_existing"}
# What the rebuild runs as: on the simulator, logging nowhere, replacing an earlier rebuild.
_REBUILT_AS = ("executor=sim", "logger=none", "on_existing=overwrite")
# Keys a recorded run may hold under their old name: rebuilt under today's.
_MOVED = {"measure.chunk_align": "scheduler.chunk_align"}
# Knobs added since whose default runs otherwise than the engine did before them: a run recorded
# without one ran as this value (sarathi aligned no chunk before chunk_align existed).
_BEFORE = {"scheduler.chunk_align": "none"}
# The groups whose options hold different keys: the option chosen by the key the run recorded.
_CHOSEN_BY = {"scheduler": "name", "workload": "kind"}
_ABSENT = object()


def overrides_of(run_dir: Path) -> list[str]:
    """The run's command line under today's keys, less what a simulated rebuild sets itself: the
    rebuild records it as its own (the analysis tells jobs apart by it); its config is
    ``recorded_config``'s."""
    given = read_record(run_dir / METRICS)["overrides"]
    today = [o.replace(key, _MOVED[key], 1) if (key := override_key(o)) in _MOVED
             else o for o in given]
    return [o for o in today if override_key(o) not in _NOT_CARRIED and not o.startswith("hydra")]


def recorded_config(run_dir: Path) -> DictConfig:
    """The config the run ran, as a simulated run: its recorded keys over today's groups (which
    give only the keys added since), checked as a run's config is."""
    tree = copy.deepcopy(read_record(run_dir / METRICS)["resolved_config"])
    for key in _NOT_CARRIED.values():
        _pop(tree, key)
    scheduler = (tree.get("scheduler") or {}).get("name")
    for old, new in _MOVED.items():
        value = _pop(tree, old)
        if value is not _ABSENT and _applies(new, scheduler) and _get(tree, new) is _ABSENT:
            _put(tree, new, value)
    for key, value in _BEFORE.items():
        if _applies(key, scheduler) and _get(tree, key) is _ABSENT:
            _put(tree, key, value)
    choices = [f"{group}={option}" for group, key in _CHOSEN_BY.items()
               if isinstance(option := (tree.get(group) or {}).get(key), str)
               and (CONF_DIR / group / f"{option}.yaml").is_file()]
    cfg = compose_config([*choices, *_REBUILT_AS])
    OmegaConf.set_struct(cfg, False)  # a key gone since is the check's to name, not the merge's
    cfg = OmegaConf.merge(cfg, tree)
    try:
        parse_config(cfg)
    except ConfigError as e:
        raise ConfigError(f"{run_dir} cannot be rebuilt from its recorded config: {e}") from None
    return cfg


def rebuild(run_dir: Path, config: DictConfig, dest: Path, device: str, cost_model: str) -> None:
    """``config`` (``recorded_config``'s) simulated on ``device`` under ``cost_model``, into
    ``dest``."""
    config = copy.deepcopy(config)
    OmegaConf.update(config, "engine.sim_device", device)
    OmegaConf.update(config, "engine.sim_cost_model", cost_model)
    executor, *rest = _REBUILT_AS
    given = [*overrides_of(run_dir), executor, f"engine.sim_device={device}",
             f"engine.sim_cost_model={cost_model}", *rest]
    try:
        run_composed(config, given, dest)
    except ConfigError as e:
        raise ConfigError(f"{run_dir} cannot be rebuilt: {e}") from None


def _applies(key: str, scheduler: Any) -> bool:
    """A scheduler's knob only where the run's scheduler has it (the others ran without it)."""
    section, _, name = key.partition(".")
    return section != "scheduler" or scheduler in knob_owners(name)


def _get(tree: dict, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _ABSENT
        tree = tree[part]
    return tree


def _pop(tree: dict, key: str) -> Any:
    parent, _, last = key.rpartition(".")
    holder = _get(tree, parent) if parent else tree
    return holder.pop(last, _ABSENT) if isinstance(holder, dict) else _ABSENT


def _put(tree: dict, key: str, value: Any) -> None:
    *parents, last = key.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[last] = value
