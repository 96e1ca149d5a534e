"""Check group choices on the command line (scheduler=, model=, experiment=, ...) before Hydra starts.

Hydra reports an unknown choice with the search path and a hint to set HYDRA_FULL_ERROR; this
gives the same verdict as one line, and exits before any output directory exists.
"""
from __future__ import annotations

from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep
from hydra.errors import HydraException

from sarathi_lab.harness import CONF_DIR


def bad_group_choice(args: list[str], conf_dir: Path = CONF_DIR) -> str | None:
    """The one-line error for the first unknown group choice among the overrides in args, or None."""
    parser = OverridesParser.create()
    for arg in args:
        try:
            override = parser.parse_override(arg)
        except HydraException:
            continue  # flags (-m, --cfg job) and their values; Hydra parses those itself
        group_dir = conf_dir / override.key_or_group
        # Plugin-provided groups (hydra/launcher=...) and glob/range sweeps are Hydra's to check.
        if override.is_delete() or override.key_or_group.startswith("hydra") or not group_dir.is_dir():
            continue
        value = override.value()
        if value is None:  # `experiment=null`: no choice at all
            continue
        if override.is_sweep_override() and not isinstance(value, ChoiceSweep):
            continue
        choices = list(override.sweep_string_iterator()) if override.is_sweep_override() else [str(value)]
        allowed = sorted(p.stem for p in group_dir.glob("*.yaml"))
        for choice in choices:
            if choice not in allowed:
                return f"{override.key_or_group}={choice!r} is invalid: allowed values are {', '.join(allowed)}"
    return None
