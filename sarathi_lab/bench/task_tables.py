"""The measurement tasks' tables read as iterations a cost model can be held to: which table each task
writes (``harness/tasks/<task>.py``), which rows of it are one forward, of what kind, and what else
it times (a sum of iterations, one layer's attention, a request end to end), each row named by
columns that say what was batched, so that a measured table and its simulated rebuild (the same task
run with ``executor=sim``, whose batches are the same hand-built ones, each priced by
``CostModel.iteration_cost``) pair row by row.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

# Quantities of the tasks that are no single iteration: the errors are reported apart from the
# iteration kinds' (engine.metrics.iteration_kinds: decode, prefill, hybrid).
CHUNKS_SUMMED = "prefill chunks, summed"  # a prompt's chunk iterations, served one after another
ONE_LAYER_ATTENTION = "attention, one layer"
END_TO_END = "request end to end"


@dataclass(frozen=True)
class TaskTable:
    """One task's table (``<name>.parquet`` in its run folder) as rows of ``keys``, a ``kind`` and the
    measured (or predicted) ``seconds``, from ``rows``."""
    name: str
    keys: tuple[str, ...]
    rows: Callable[[pd.DataFrame], pd.DataFrame]

    def points(self, frame: pd.DataFrame) -> pd.DataFrame:
        return self.rows(frame)[[*self.keys, "kind", "seconds"]].reset_index(drop=True)


def _forward_totals(frame: pd.DataFrame) -> pd.DataFrame:
    """A table split by op (``profiling.ops``): the forward's ``total`` rows, in seconds."""
    return frame[frame.op == "total"].assign(seconds=lambda f: f.ms / 1e3)


def _op_breakdown(frame: pd.DataFrame) -> pd.DataFrame:
    # batch_size prompts prefilled whole, and batch_size decodes.
    return _forward_totals(frame).assign(kind=lambda f: f.phase.map({"prefill": "prefill", "decode": "decode"}))


PIGGYBACK_KINDS = {"decode_only": "decode", "chunk_alone": "prefill", "hybrid": "hybrid"}


def _piggyback(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(kind=frame.iteration.map(PIGGYBACK_KINDS), seconds=frame.ms / 1e3)


def _iteration_sweep(frame: pd.DataFrame) -> pd.DataFrame:
    return _forward_totals(frame).assign(kind="prefill")  # one prompt of ``tokens``, prefilled whole


def _reread(frame: pd.DataFrame) -> pd.DataFrame:
    """Each component prefilled whole and in chunks, one row each: the whole prompt's prefill is one
    iteration; its chunks are several, summed."""
    long = frame.melt(id_vars="component", value_vars=["whole_ms", "chunked_ms"], var_name="mode",
                      value_name="ms")
    long["mode"] = long["mode"].str.removesuffix("_ms")
    other = {"attention": ONE_LAYER_ATTENTION, "end_to_end": END_TO_END}
    kind = [("prefill" if mode == "whole" else CHUNKS_SUMMED) if component == "prefill"
            else other[component]
            for component, mode in zip(long.component, long["mode"])]
    return long.assign(kind=kind, seconds=long.ms / 1e3)


TABLES = {
    "op_breakdown": TaskTable("ops", ("phase", "tokens"), _op_breakdown),
    "piggyback": TaskTable("piggyback", ("iteration", "tokens"), _piggyback),
    "iteration_sweep": TaskTable("sweep", ("tokens",), _iteration_sweep),
    "reread": TaskTable("overhead", ("component", "mode"), _reread),
}


def paired(task: str, measured: pd.DataFrame, simulated: pd.DataFrame) -> tuple[pd.DataFrame, bool]:
    """The rows of ``task``'s measured table beside its simulated rebuild's (``measured_s``,
    ``simulated_s``), and whether the rebuild timed exactly the measured rows (the measure tasks'
    counterpart of identical batches)."""
    spec = TABLES[task]
    real, sim = spec.points(measured), spec.points(simulated)
    keys = list(spec.keys)
    both = real.rename(columns={"seconds": "measured_s"}).merge(
        sim.drop(columns="kind").rename(columns={"seconds": "simulated_s"}), on=keys, how="inner")
    same = len(both) == len(real) == len(sim)
    label = [", ".join(f"{k}={v}" for k, v in zip(keys, row)) for row in both[keys].itertuples(index=False)]
    return both.assign(label=label), same
