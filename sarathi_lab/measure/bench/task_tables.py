"""The measurement tasks' tables read as iterations a cost model can be held to, each row named by
what was batched, so that a measured table and its ``executor=sim`` rebuild pair row by row."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

# Quantities that are no single iteration, reported apart from the iteration kinds'.
CHUNKS_SUMMED = "prefill chunks, summed"
ONE_LAYER_ATTENTION = "attention, one layer"
END_TO_END = "request end to end"


@dataclass(frozen=True)
class TaskTable:
    """``<name>.parquet`` in its run folder, as rows of ``keys``, a ``kind`` and ``seconds``."""
    name: str
    keys: tuple[str, ...]
    rows: Callable[[pd.DataFrame], pd.DataFrame]

    def points(self, frame: pd.DataFrame) -> pd.DataFrame:
        return self.rows(frame)[[*self.keys, "kind", "seconds"]].reset_index(drop=True)


def _forward_totals(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame.op == "total"].assign(seconds=lambda f: f.ms / 1e3)


def _op_breakdown(frame: pd.DataFrame) -> pd.DataFrame:
    kinds = {"prefill": "prefill", "decode": "decode"}
    return _forward_totals(frame).assign(kind=lambda f: f.phase.map(kinds))


PIGGYBACK_KINDS = {"decode_only": "decode", "chunk_alone": "prefill", "hybrid": "hybrid"}


def _reread(frame: pd.DataFrame) -> pd.DataFrame:
    """A whole prompt's prefill is one iteration; its chunks are several, summed."""
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
    "piggyback": TaskTable("piggyback", ("iteration", "tokens"), lambda frame: frame.assign(
        kind=frame.iteration.map(PIGGYBACK_KINDS), seconds=frame.ms / 1e3)),
    # one prompt prefilled whole
    "iteration_sweep": TaskTable("sweep", ("tokens",),
                                 lambda frame: _forward_totals(frame).assign(kind="prefill")),
    "reread": TaskTable("overhead", ("component", "mode"), _reread),
}


def paired(task: str, measured: pd.DataFrame, simulated: pd.DataFrame) -> tuple[pd.DataFrame, bool]:
    """Also whether the rebuild timed exactly the measured rows (its identical batches)."""
    spec = TABLES[task]
    real, sim = spec.points(measured), spec.points(simulated)
    keys = list(spec.keys)
    both = real.rename(columns={"seconds": "measured_s"}).merge(
        sim.drop(columns="kind").rename(columns={"seconds": "simulated_s"}), on=keys, how="inner")
    same = len(both) == len(real) == len(sim)
    label = [", ".join(f"{k}={v}" for k, v in zip(keys, row))
             for row in both[keys].itertuples(index=False)]
    return both.assign(label=label), same
