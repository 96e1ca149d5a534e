"""Measurements that are not serving runs, one module per task (adding one adds the task):
``run(cfg, llm)`` returns ``(summary, tables)``; optional ``TAKES_CONTEXT``, ``kv_requests(cfg,
plan)`` (so the preflight refuses a cache too small) and ``check(cfg, context)``."""
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
    return getattr(importlib.import_module(f"{__name__}.{task}"), "TAKES_CONTEXT", False)


@dataclass(frozen=True)
class TaskContext:
    """``record_run(run_dir, name, summary, metrics, config, partial=False)`` records a serving
    run of the task's own; ``save_partial(summary, tables)`` its records so far."""
    run_dir: Path
    workload: Any
    record_run: Callable[..., None]
    save_partial: Callable[..., None]
    resolved_config: dict[str, Any]


def kv_requests(task: str, cfg, plan) -> list[int]:
    """The requests ``task`` holds in the KV cache at once; none beyond one without the hook."""
    module = importlib.import_module(f"{__name__}.{task}")
    return module.kv_requests(cfg, plan) if hasattr(module, "kv_requests") else []


def check_task(task: str, cfg, context: int) -> None:
    """Refuses, before any measuring, what ``task`` cannot do on a model of ``context`` tokens."""
    module = importlib.import_module(f"{__name__}.{task}")
    if hasattr(module, "check"):
        module.check(cfg, context)


def kv_blocks(lengths: list[int], block_size: int) -> int:
    return sum(blocks_for(n, block_size) for n in lengths)
