"""Measurements that are not serving runs, behind the harness's results contract.

Each module's ``run(cfg, llm)`` times one thing on the engine the harness built from the run's
config and returns ``(summary, tables)``: scalars for metrics.json and W&B's summary, and named
DataFrames that land as ``<name>.parquet`` (``load_runs(dir, table=name)`` reads them back).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable

import pandas as pd

# The `task` values besides serve: one module of this package each. Imported on use, so that the
# config schema can name them without importing the engine code they drive.
TASKS = ("op_breakdown", "iteration_sweep", "reread", "piggyback")

Measurement = Callable[..., tuple[dict[str, float], dict[str, pd.DataFrame]]]


def measurement(task: str) -> Measurement:
    return importlib.import_module(f"{__name__}.{task}").run
