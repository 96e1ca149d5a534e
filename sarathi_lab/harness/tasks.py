"""The measurements a run can be besides serving (``task=NAME``), named in one table: each a module
of the measurement wing with ``run(cfg, llm)`` -> (summary, tables), optionally TAKES_CONTEXT,
kv_requests, check."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from sarathi_lab.engine.block_manager import blocks_for

if TYPE_CHECKING:
    import pandas as pd

Measurement = Callable[..., "tuple[dict[str, float], dict[str, pd.DataFrame]]"]
# name -> "module:function" that measures it; the module is imported only when its task is used (a
# task may load torch), and holds the task's optional hooks beside the function. The names are the
# wing's, above the harness: named here as data, so that no import's side effect registers them.
TASKS: dict[str, str] = {
    "capacity": "sarathi_lab.measure.tasks.capacity:run",
    "iteration_sweep": "sarathi_lab.measure.tasks.iteration_sweep:run",
    "op_breakdown": "sarathi_lab.measure.tasks.op_breakdown:run",
    "piggyback": "sarathi_lab.measure.tasks.piggyback:run",
    "pipeline_bubbles": "sarathi_lab.measure.tasks.pipeline_bubbles:run",
    "profile": "sarathi_lab.measure.tasks.profile:run",
    "reread": "sarathi_lab.measure.tasks.reread:run",
}


def task_names() -> tuple[str, ...]:
    """The `task` values besides serve."""
    return tuple(sorted(TASKS))


def _module(task: str) -> ModuleType:
    if task not in TASKS:
        raise ValueError(f"task={task!r} is not a measurement; allowed: {', '.join(task_names())}")
    return importlib.import_module(TASKS[task].partition(":")[0])


def measurement(task: str) -> Measurement:
    return getattr(_module(task), TASKS[task].partition(":")[2])


def takes_context(task: str) -> bool:
    return getattr(_module(task), "TAKES_CONTEXT", False)


@dataclass(frozen=True)
class TaskContext:
    """``record_run(...)`` records a serving run of the task's own; ``save_partial`` its records."""
    run_dir: Path
    workload: Any
    record_run: Callable[..., None]
    save_partial: Callable[..., None]
    resolved_config: dict[str, Any]


def kv_requests(task: str, cfg, plan) -> list[int]:
    """The requests ``task`` holds in the KV cache at once; none beyond one without the hook."""
    return getattr(_module(task), "kv_requests", lambda cfg, plan: [])(cfg, plan)


def check_task(task: str, cfg, context: int) -> None:
    """Refuses, before any measuring, what ``task`` cannot do on a model of ``context`` tokens."""
    getattr(_module(task), "check", lambda cfg, context: None)(cfg, context)


def kv_blocks(lengths: list[int], block_size: int) -> int:
    return sum(blocks_for(n, block_size) for n in lengths)
