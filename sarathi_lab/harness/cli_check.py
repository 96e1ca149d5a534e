"""The command line checked before Hydra starts: a bad argument refused in one line, no dir made."""
from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Override
from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf

from sarathi_lab.harness import CONF_DIR, experiment_variants


@functools.lru_cache(maxsize=4)
def _parse(args: tuple[str, ...]
           ) -> tuple[argparse.Namespace | None, list[str], list[tuple[str, Override]]]:
    """(flags, None for a bad one; words no flag nor a flag's value; overrides), parsed once."""
    parser, overrides = OverridesParser.create(), []
    for arg in args:
        try:
            overrides.append((arg, parser.parse_override(arg)))
        except HydraException:
            continue
    flag_parser = get_args_parser()
    flag_parser.exit_on_error = False
    try:
        flags, extra = flag_parser.parse_known_args(args)
    except argparse.ArgumentError:
        return None, [], overrides
    return flags, [*flags.overrides, *(a for a in extra if not a.startswith("-"))], overrides


def _other_configs(flags: argparse.Namespace | None, overrides: list[tuple[str, Override]]) -> bool:
    """Configs beside or instead of CONF_DIR (--config-dir, hydra.searchpath=...)."""
    if flags is not None and (flags.config_dir or flags.config_path or flags.config_name):
        return True
    return any(o.key_or_group == "hydra.searchpath" for _, o in overrides)


def check_command_line(args: list[str]) -> str | None:
    flags, words, overrides = _parse(tuple(args))
    parsed = {arg for arg, _ in overrides}
    # A malformed value is Hydra's to report, with the grammar's own pointer.
    for word in words:
        if "=" not in word and word not in parsed:
            return (f"{word} is invalid: an argument must be a key=value override (chunk=256; "
                    "+key=value adds a key, ~key deletes one) or a flag (-m for a multirun sweep, "
                    "--cfg job, --help)")
    for arg, override in overrides:
        if flags is not None and not flags.multirun and override.is_sweep_override() \
                and not override.key_or_group.startswith("hydra"):
            return (f"{arg} is invalid without -m: a sweep runs one job per value with -m first "
                    f"(-m {arg}); a list is key=[a,b]")
    for _, override in overrides:
        # name= is the folder of the run: ../../x would write outside outputs/.
        if override.key_or_group != "name" or override.is_delete():
            continue
        values = (list(override.sweep_string_iterator()) if override.is_sweep_override()
                  else [str(override.value())])
        for value in values:
            if not value or value in (".", "..") or any(c in value for c in "/\\\0"):
                return (f"name={value!r} is invalid: it is the folder of the run under outputs/, "
                        "so it must be one plain folder name (no '/', not '.' or '..')")
    if flags is not None and sum(map(bool, (flags.run, flags.multirun, flags.cfg, flags.info,
                                            flags.shell_completion))) > 1:
        return ("the command line is invalid: only one of --run, -m (--multirun), --cfg, --info "
                "and --shell-completion can be given (Hydra's modes)")
    if problem := _sweeper_option_problem(overrides):
        return problem
    if _other_configs(flags, overrides):
        return None
    try:
        return _plugin_choice_problem(overrides) or _bad_choice_or_key(overrides)
    except ConfigCompositionException as e:  # Hydra's own refusal, as one line
        return _composition_refusal(e)


def _plugin_choice_problem(overrides: list[tuple[str, Override]]) -> str | None:
    """hydra/launcher=NAME and other groups of Hydra's plugins: composed alone, each is known."""
    for _, override in overrides:
        if override.key_or_group.startswith("hydra/") and not override.is_delete():
            for value in _group_values(override) or []:
                _compose_once((f"{override.key_or_group}={value}",))
    return None


def _composition_refusal(e: ConfigCompositionException) -> str:
    missing = getattr(e, "missing_cfg_file", None) or ""
    group, _, value = missing.rpartition("/")
    if isinstance(e, MissingConfigException) and group and e.options:
        return f"{group}={value!r} is invalid: allowed values are {', '.join(e.options)}"
    return f"the command line is invalid: {' '.join(str(e).split())[:300]}"


# The sweeper's options and what each allows: Hydra hands them over unchecked.
_SWEEPER_OPTIONS = {
    "hydra.sweeper.max_batch_size": ("null, or an integer >= 1 (jobs per batch)",
                                     lambda v: v is None or type(v) is int and v >= 1),
    "hydra.sweeper.repeat_ignored": ("true, false", lambda v: type(v) is bool),
}


def _sweeper_option_problem(overrides: list[tuple[str, Override]]) -> str | None:
    for _, override in overrides:
        allowed = _SWEEPER_OPTIONS.get(override.key_or_group)
        if allowed is None or override.is_delete():
            continue
        values = (list(override.sweep_iterator()) if override.is_sweep_override()
                  else [override.value()])
        bad = next((v for v in values if not allowed[1](v)), None)
        if bad is not None or not values:
            return f"{override.key_or_group}={bad!r} is invalid: allowed values are {allowed[0]}"
    return None


def output_dir_problem(args: list[str]) -> tuple[str, int] | None:
    """(error, exit code: 2 the command's fault, 1 the machine's), else Hydra's traceback."""
    flags, _, overrides = _parse(tuple(args))
    if flags is None or _other_configs(flags, overrides):
        return None
    try:
        hydra = _composed(overrides).hydra
        key = "hydra.sweep.dir" if flags.multirun else "hydra.run.dir"
        target = Path(str(hydra.sweep.dir if flags.multirun else hydra.run.dir)).absolute()
    except Exception:  # noqa: BLE001 - a config Hydra will refuse itself
        return None
    existing = next(p for p in (target, *target.parents) if p.exists() or p.is_symlink())
    if not existing.is_dir():
        what = "is a file" if existing == target else f"lies under {existing}, which is a file"
        return f"{key}={target} is invalid: it {what}, not a directory", 2
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "it" if existing == target else f"{existing}, where it would be created,"
        why = "a read-only filesystem, or no permission"
        return (f"{key}={target} cannot be written: {where} is read-only ({why}); "
                "choose another directory"), 1
    return None


def _group_values(override: Override) -> list[str] | None:
    """None for a glob or range, Hydra's to expand and check."""
    value = override.value()
    if override.is_sweep_override():
        return list(override.sweep_string_iterator()) if isinstance(value, ChoiceSweep) else None
    return [] if value is None else [str(value)]


def _group_options(group_dir: Path) -> list[str]:
    # Options in subfolders too, and an experiment's variants: experiment=ci/pd_ratio.
    files = [p.relative_to(group_dir).with_suffix("").as_posix() for p in group_dir.rglob("*.yaml")]
    variants = experiment_variants.names(group_dir.parent) \
        if group_dir.name == experiment_variants.GROUP else []
    return sorted({*files, *variants})


def _bad_choice_or_key(overrides: list[tuple[str, Override]]) -> str | None:
    keys, globbed, added, schedulers = [], False, set(), set()
    for arg, override in overrides:
        key = override.key_or_group
        if not (CONF_DIR / key).is_dir():
            if not (key.startswith("hydra") or override.is_force_add() or override.is_delete()) \
                    and (not override.is_add() or _knob_owners(key)):
                keys.append((arg, key))
                added |= {arg} if override.is_add() else set()
            continue
        values = _group_values(override)
        globbed |= values is None
        schedulers |= set(values or []) if key == "scheduler" else set()
        if override.is_delete() or not values:
            continue
        allowed = _group_options(CONF_DIR / key)
        # Plugin-provided options (hydra/launcher=submitit_local) are Hydra's to check.
        bad = next((c for c in values if c not in allowed and not key.startswith("hydra")), None)
        if bad is not None:
            return f"{key}={bad!r} is invalid: allowed values are {', '.join(allowed)}"
    if not keys or globbed:
        return None
    choices = _group_choices(overrides)
    # Unresolved: a key is known whatever its value (`???`, an interpolation) would resolve to.
    tree = OmegaConf.to_container(_composed(overrides), resolve=False)
    tree.pop("hydra", None)
    known = set(_dotted_keys(tree))
    for arg, key in keys:
        if key in known or arg in added and set(_knob_owners(key)) & schedulers:
            continue  # a sweep over schedulers, one of which reads it
        from sarathi_lab.harness.schema import unknown_key

        return (_knob_owners(key) and _foreign_knob(arg, overrides, choices)) or \
            _other_executor_key(arg, key) or str(unknown_key(key, arg.partition("=")[2], known))
    return None


def _other_executor_key(arg: str, key: str) -> str | None:
    """engine.sim_pp without executor=sim: a key only another executor's config holds."""
    from sarathi_lab.executors import executor_class

    for path in sorted((CONF_DIR / "executor").glob("*.yaml")):
        tree = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        if key in set(_dotted_keys(tree)):
            noun = executor_class(path.stem).noun.removeprefix("the ")
            return f"{arg} is invalid: {key} is a {noun} setting: add executor={path.stem}"
    return None


def _knob_owners(key: str) -> list[str]:
    if not key.startswith("scheduler."):
        return []
    from sarathi_lab.engine.scheduler.base import knob_owners

    return knob_owners(key.removeprefix("scheduler."))


def _foreign_knob(arg: str, overrides: list[tuple[str, Override]],
                  choices: list[str]) -> str | None:
    from sarathi_lab.engine.scheduler.base import foreign_knob
    from sarathi_lab.harness.schema import RUN_KEYS

    override = dict(overrides)[arg]
    chosen = next((c.partition("=")[2] for c in choices if c.startswith("scheduler=")), None)
    chosen = chosen or OmegaConf.select(_composed(overrides), "scheduler.name")
    swept = override.is_sweep_override()
    value = next(iter(override.sweep_iterator())) if swept else override.value()
    refused = foreign_knob(chosen, override.key_or_group.removeprefix("scheduler."), value)
    return refused and str(refused.named(RUN_KEYS))


def added_knobs(args: list[str]) -> list[str]:
    """In a sweep over schedulers, a knob some of them lack (``scheduler=vllm,sarathi
    scheduler.max_num_batched_tokens=512``) as ``+scheduler.KNOB=``: Hydra adds it to the configs
    that lack it (which ignore it, and say so) where a plain override stops at the first."""
    flags, _, overrides = _parse(tuple(args))
    knobs = {arg: o.key_or_group.removeprefix("scheduler.") for arg, o in overrides
             if o.key_or_group.startswith("scheduler.")
             and not (o.is_add() or o.is_force_add() or o.is_delete())  # '+++' is no override
             and _knob_owners(o.key_or_group)}
    if not knobs or flags is None or not flags.multirun or _other_configs(flags, overrides):
        return args
    swept = next((v for _, o in overrides if o.key_or_group == "scheduler"
                  and (v := _group_values(o)) and len(v) > 1), None)
    if swept is None:
        try:
            params = _composed(overrides).hydra.sweeper.params or {}
        except Exception:  # noqa: BLE001 - a config Hydra will refuse itself
            return args
        swept = str(params.get("scheduler", "")).replace(" ", "").split(",")
    from sarathi_lab.engine.scheduler.base import knob_owners

    return [f"+{arg}" if arg in knobs and set(swept) - set(knob_owners(knobs[arg]))
            and len(swept) > 1 else arg for arg in args]


def sweep_note(args: list[str]) -> str | None:
    """With --cfg, what the experiment's sweep sets per job: one composed config cannot show it."""
    flags, _, overrides = _parse(tuple(args))
    choices = [arg for arg, o in overrides
               if o.key_or_group == "experiment" and not o.is_sweep_override()]
    if "--cfg" not in args and "-c" not in args or not choices or _other_configs(flags, overrides):
        return None
    params = compose_config(choices, hydra=True).hydra.sweeper.params or {}
    if not params:
        return None
    swept = "; ".join(f"{k}: {v}" for k, v in params.items())
    return (f"# -m runs one job per combination of {swept} (command-line values win), "
            "over the config below")


def resumable(args: list[str]):
    """(sweep dir, its state, whether on_existing=skip) of the newest unfinished sweep this same
    command launched, where this launch would start a new one; else None."""
    from sarathi_lab.harness.sweep_resume import SWEEP_DIR, planned_sweep_dir, unfinished_sweep

    flags, words, overrides = _parse(tuple(args))
    if flags is None or not flags.multirun or _other_configs(flags, overrides) \
            or any(o.key_or_group == SWEEP_DIR for _, o in overrides):
        return None
    try:
        composed = _composed(overrides)
        sweep_dir, fresh = planned_sweep_dir(composed)
    except Exception:  # noqa: BLE001 - a config Hydra will refuse itself
        return None
    found = unfinished_sweep(words, sweep_dir) if fresh else None
    if found is None:
        return None
    given = [str(o.value()) for _, o in overrides
             if o.key_or_group == "on_existing" and not o.is_sweep_override()]
    skip = (given[-1] if given else composed.get("on_existing")) == "skip"
    return (*found, skip)


def _group_choices(overrides: list[tuple[str, Override]]) -> list[str]:
    """A sweep's first choice."""
    return [f"{o.key_or_group}={values[0]}" for _, o in overrides
            if (CONF_DIR / o.key_or_group).is_dir() and not o.is_delete()
            and (values := _group_values(o))]


def _composed(overrides: list[tuple[str, Override]]) -> DictConfig:
    run_dir = [arg for arg, o in overrides if not o.is_sweep_override() and not o.is_delete()
               and (o.key_or_group == "name"
                    or o.key_or_group.startswith(("hydra.run.", "hydra.sweep.")))]
    return _compose_once((*_group_choices(overrides), *run_dir))


@functools.lru_cache(maxsize=4)
def _compose_once(overrides: tuple[str, ...]) -> DictConfig:
    # A composition is a tenth of a run's start: a command line's checks compose once.
    return compose_config(list(overrides), hydra=True)


def compose_config(overrides: list[str], hydra: bool = False) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra)


def _dotted_keys(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        yield f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _dotted_keys(value, f"{prefix}{key}.")
