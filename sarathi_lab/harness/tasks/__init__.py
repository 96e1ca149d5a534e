"""Measurements that are not serving runs, behind the harness's results contract.

One module per task (adding one adds the task): ``run(cfg, llm)`` returns ``(summary, tables)``,
scalars for metrics.json and DataFrames saved as ``<name>.parquet``; a task that needs the run's
context (it records serving runs of its own, or serves the run's workload) says so,
``TAKES_CONTEXT = True``, and takes a third argument, a TaskContext. One that holds
several requests in the KV cache at once says how long they are, ``kv_requests(cfg, plan)`` (``plan``:
the run's EnginePlan, its typed scheduler config included), so that the preflight refuses a cache too
small.
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sarathi_lab.engine.block_manager import blocks_for

if TYPE_CHECKING:
    import pandas as pd

# The `task` values besides serve.
TASKS = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")))

Measurement = Callable[..., "tuple[dict[str, float], dict[str, pd.DataFrame]]"]


def measurement(task: str) -> Measurement:
    if task not in TASKS:
        raise ValueError(f"task={task!r} is not a measurement; allowed: {', '.join(TASKS)}")
    return importlib.import_module(f"{__name__}.{task}").run


def takes_context(task: str) -> bool:
    """Whether ``task`` takes a TaskContext (its module's ``TAKES_CONTEXT``)."""
    return getattr(importlib.import_module(f"{__name__}.{task}"), "TAKES_CONTEXT", False)


@dataclass(frozen=True)
class TaskContext:
    """What the runner gives a task that takes its context. ``record_run(run_dir, name, summary,
    metrics, config, partial=False)`` writes a serving run's results and logs it to W&B in this run's
    group; ``save_partial(summary, tables)`` writes the task's records so far as *.partial.*."""
    run_dir: Path
    workload: Any
    record_run: Callable[..., None]
    save_partial: Callable[..., None]
    resolved_config: dict[str, Any]


def kv_requests(task: str, cfg, plan) -> list[int]:
    """The lengths of the requests ``task`` holds in the KV cache at once (its module's
    ``kv_requests(cfg, plan)``, which may refuse, in one line, a batch it cannot build); else none beyond
    one request."""
    module = importlib.import_module(f"{__name__}.{task}")
    return module.kv_requests(cfg, plan) if hasattr(module, "kv_requests") else []


def check_task(task: str, cfg, context: int) -> None:
    """Refuses, in one line before any measuring, what ``task`` cannot do with ``cfg`` on a model of
    ``context`` tokens (its module's ``check(cfg, context)``, where it has one)."""
    module = importlib.import_module(f"{__name__}.{task}")
    if hasattr(module, "check"):
        module.check(cfg, context)


def kv_blocks(lengths: list[int], block_size: int) -> int:
    """The KV cache blocks requests of these lengths take together."""
    return sum(blocks_for(n, block_size) for n in lengths)
