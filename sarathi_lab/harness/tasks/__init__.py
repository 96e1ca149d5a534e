"""Measurements that are not serving runs, behind the harness's results contract.

One module per task: its ``run(cfg, llm)`` times one thing on the engine the harness built from
the run's config and returns ``(summary, tables)``: scalars for metrics.json and W&B's summary, and
named DataFrames that land as ``<name>.parquet`` (``load_runs(dir, table=name)`` reads them back).
A task that writes runs of its own (capacity: one per trial, under its directory) takes a third
argument, ``run(cfg, llm, context: TaskContext)``. One that holds a batch of several requests in the
KV cache says how long they are, ``kv_requests(cfg)``, so that the preflight refuses a cache too small
for them. Adding a module adds the task: the names are the modules found here, listed without importing
them, so that the config schema can name the tasks without importing the engine code they drive.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

# The `task` values besides serve.
TASKS = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")))

Measurement = Callable[..., tuple[dict[str, float], dict[str, pd.DataFrame]]]


def measurement(task: str) -> Measurement:
    if task not in TASKS:
        raise ValueError(f"task={task!r} is not a measurement; allowed: {', '.join(TASKS)}")
    return importlib.import_module(f"{__name__}.{task}").run


@dataclass(frozen=True)
class TaskContext:
    """What the runner gives a task that records runs of its own: its directory, the workload the
    preflight built, ``record_run(run_dir, name, summary, metrics, config, partial=False)``, which
    writes a serving run's results (harness/results.py; ``config`` joins metrics.json's key values)
    and logs it to W&B in this run's group (partial: its *.partial.* records, and no W&B), and
    ``save_partial(summary, tables)``, which writes the task's own records so far as *.partial.*
    when a signal interrupts it. ``resolved_config``: the run's, which its records carry (a task
    resuming an interrupted run reuses only records of the same config)."""
    run_dir: Path
    workload: Any
    record_run: Callable[..., None]
    save_partial: Callable[..., None]
    group: str
    resolved_config: dict[str, Any] = field(default_factory=dict)


def kv_requests(task: str, cfg) -> list[int]:
    """The lengths of the requests ``task`` holds in the KV cache at once, where its module says
    (``kv_requests(cfg)``: the tasks that time batches of several); else none beyond one request."""
    module = importlib.import_module(f"{__name__}.{task}")
    return module.kv_requests(cfg) if hasattr(module, "kv_requests") else []


def kv_blocks(lengths: list[int], block_size: int) -> int:
    """The KV cache blocks requests of these lengths take together."""
    return sum(-(-n // block_size) for n in lengths)


def takes_context(task: Measurement) -> bool:
    return len(inspect.signature(task).parameters) == 3
