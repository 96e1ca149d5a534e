"""What a run writes and logs, one object, so the run, its partials and a task's runs agree."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from sarathi_lab import Metrics
from sarathi_lab import host_load as load
from sarathi_lab.harness.environment import collect_environment
from sarathi_lab.harness.results import RunResult, write_results
from sarathi_lab.harness.schema import RunConfig
from sarathi_lab.harness.wandb_logger import WandbName, WandbRun, WandbSession

if TYPE_CHECKING:
    import pandas as pd

    Tables = dict[str, pd.DataFrame | pa.Table]  # a measurement's DataFrames, or the engine's

log = logging.getLogger(__name__)


@dataclass
class RunRecorder:
    cfg: RunConfig
    llm: Any
    resolved_config: dict[str, Any]
    overrides: list[str]
    inputs: dict[str, Any]
    plan_record: dict[str, Any]  # what the plan settled that the config does not say
    group: str
    run_dir: Path
    # The W&B run opened as the run began (None: opened when it is logged).
    wandb: WandbSession | None = None
    # The machine's load when the run began, which assess() compares the end against.
    before: Any = field(default_factory=load.snapshot)
    start: float = field(default_factory=time.perf_counter)

    def save(self, directory: Path, summary: dict[str, float], tables: Tables, partial: bool,
             config: dict[str, Any] | None = None) -> dict[str, Any]:
        directory.mkdir(parents=True, exist_ok=True)
        llm = self.llm
        environment = collect_environment(llm.config, llm.device, llm.dtype, llm.cpu_gemm,
                                          self._machine(), llm.cuda_graphs)
        # Our engine's: the parts it built or took from the sweep's earlier job, the seconds its
        # set-up took, the warm-up it ran and discarded (none of it in the measured records).
        environment["engine_setup"] = getattr(llm, "setup", None)
        # The chunk alignment that ran (auto settled), which results tables are indexed by.
        settled = {"chunk_align": llm.plan.scheduler_config.chunk_alignment}
        write_results(directory, tables, RunResult(
            summary=summary | self.plan_record,
            config=self.cfg.key_values() | settled | (config or {}),
            overrides=self.overrides, resolved_config=self.resolved_config, environment=environment,
            partial=partial, wall_time_s=time.perf_counter() - self.start, inputs=self.inputs))
        return environment

    def log(self, directory: Path, name: str, summary: dict[str, float], tables: Tables,
            environment: dict[str, Any]) -> None:
        named = wandb_name(self.cfg, directory, name, self.group, self.resolved_config)
        session, self.wandb = self.wandb or WandbSession(self.cfg.logger), None
        session.log(WandbRun(
            run_dir=directory, name=named.name, group=named.group, job_type=named.job_type,
            tags=named.tags, config=named.config, environment=environment,
            summary=summary | self.plan_record,
            history=tables.get("iterations"),
            tables={k: v for k, v in tables.items() if k != "iterations"}))

    def record_run(self, directory: Path, name: str, summary: dict[str, float], metrics: Metrics,
                   config: dict[str, Any], partial: bool = False) -> None:
        tables = engine_tables(metrics)
        environment = self.save(directory, summary, tables, partial=partial, config=config)
        if not partial:  # W&B gets finished runs only
            self.log(directory, name, summary, tables, environment)

    def save_partial(self, summary: dict[str, float], tables: Tables) -> None:
        self.save(self.run_dir, summary, tables, partial=True)
        log.warning("interrupted: partial records saved in %s as *.partial.*", self.run_dir)

    def _machine(self) -> dict[str, Any]:
        machine = load.assess(self.before, load.snapshot()) | self.cfg.engine.kind.load_record
        if machine["timing_note"]:
            log.warning("%s", machine["timing_note"])
        if why := self.cfg.engine.kind.timing_caveat(self.llm):
            # Whatever the load: the times are not the engine's (an interpreter's, say).
            machine |= {"timing_unreliable": True, "timing_note": why}
        return machine


def wandb_name(cfg: RunConfig, directory: Path, name: str, group: str,
               resolved_config: dict[str, Any]) -> WandbName:
    tags = [*cfg.tags, cfg.name, cfg.task, cfg.scheduler.name, cfg.model.name,
            *cfg.engine.kind.tags]
    return WandbName(run_dir=directory, name=name, group=group, job_type=cfg.name,
                     tags=list(dict.fromkeys(tags)), config=resolved_config)


def engine_tables(metrics: Metrics) -> dict[str, pa.Table]:
    """The engine's records as arrow tables typed as pandas would write them, without pandas."""
    rows = metrics.request_rows()
    requests = {name: [row[name] for row in rows] for name in (rows[0] if rows else ())}
    tables = (("iterations", metrics.iteration_columns()), ("requests", requests))
    return {name: pa.table({k: _column(v) for k, v in columns.items()})
            for name, columns in tables}


def _column(values) -> pa.Array:
    """As pandas writes a column: NaN and None as nulls, ints beside None as floats, lists."""
    if isinstance(values, np.ndarray) and values.dtype != object:
        return _numbers(values)
    values = list(values)
    if values and isinstance(values[0], (tuple, list)):
        offsets = np.zeros(len(values) + 1, np.int32)
        np.cumsum(np.fromiter(map(len, values), np.int64, len(values)), out=offsets[1:])
        items = list(chain.from_iterable(values))
        child = _column(items) if items else pa.nulls(0)
        return pa.ListArray.from_buffers(pa.list_(child.type), len(values),
                                         [None, pa.py_buffer(offsets)], children=[child])
    numbers = np.array(values)  # in C: int64 or float64 where every value is a number, else objects
    if numbers.dtype.kind in "if":
        return _numbers(numbers)
    present = [v for v in values if v is not None]
    if not present:
        return pa.nulls(len(values))
    if set(map(type, present)) <= {int, float}:
        return _numbers(np.array([np.nan if v is None else v for v in values], dtype=np.float64))
    return pa.array(values, from_pandas=True)  # no record's column: pyarrow's own conversion


def _numbers(array: np.ndarray) -> pa.Array:
    dtype, kind = {"i": (np.int64, pa.int64()), "f": (np.float64, pa.float64())}[array.dtype.kind]
    array = np.ascontiguousarray(array, dtype=dtype)
    nan = np.isnan(array) if dtype is np.float64 else None
    valid = (pa.py_buffer(np.packbits(~nan, bitorder="little"))
             if nan is not None and nan.any() else None)
    return pa.Array.from_buffers(kind, len(array), [valid, pa.py_buffer(array)])
