"""One module per kind of step: its ``run(ctx, step) -> (metrics, notes)`` and its ``STEP``, what
the planner, the staleness hash and the report read of it, so none of them lists the steps.

The modules are imported to read their ``STEP`` (plan.py does at import, and ``--plan`` runs no
GPU code): a step module imports torch, Triton and the engine inside the functions that run."""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path


def _no_paths(name: str) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True)
class Declared:
    """A step module's declaration; ``order`` None: the planner makes its steps (paper, profile)."""
    paths: tuple[str, ...]  # what its result depends on beside its module (engine_code.paths_of)
    order: float | None = None  # its place among the head steps, which run first
    minutes: float = 0.0  # expected
    what: str = ""  # --plan's line: what runs, at which shapes
    figure: Callable[[Path], bool] | None = None  # the report's figure from its result; drawn?
    figure_name: str = ""  # the figure's file, <out>/figures/<figure_name>.png
    step_paths: Callable[[str], tuple[str, ...]] = _no_paths  # a step's own beside ``paths``

    def __post_init__(self):
        if self.figure is not None and not self.figure_name:
            raise ValueError(f"STEP.figure_name={self.figure_name!r} is invalid: a step with a "
                             "figure names its file (<out>/figures/<figure_name>.png)")


@cache
def declared() -> dict[str, Declared]:
    """{group: its declaration}, head steps in their order, then the rest by name."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if isinstance(getattr(module, "STEP", None), Declared):
            found[info.name] = module.STEP
    return dict(sorted(found.items(), key=lambda kv: (kv[1].order is None, kv[1].order or 0,
                                                      kv[0])))


def head() -> dict[str, Declared]:
    """The steps that run first, one a module (the headline, then checks), in order."""
    found = {group: d for group, d in declared().items() if d.order is not None}
    orders = [d.order for d in found.values()]
    if twice := sorted({g for g, d in found.items() if orders.count(d.order) > 1}):
        raise ValueError(f"steps/{twice[0]}.py: STEP.order={found[twice[0]].order!r} is invalid: "
                         "another step has it; each head step's order must be unique")
    return found
