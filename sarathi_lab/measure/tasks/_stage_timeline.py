"""When each micro-batch ran on each stage: the executor's own timeline, else an estimate from the
iterations (exact only for one micro-batch in flight, and marked so)."""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from sarathi_lab.engine.metrics import IterationRecord

log = logging.getLogger(__name__)

TIMELINE_COLUMNS = ("stage", "micro_batch", "start_s", "end_s")
# Where recorded: when a stage had the command, when its host work was done, and its tokens.
HOST_COLUMNS = ("command_s", "planned_s", "tokens")


def estimated_timeline(iterations: list[IterationRecord], layers: list[int]) -> pd.DataFrame:
    """The forward runs stage after stage, each its share of the layers."""
    share = np.cumsum([0, *layers]) / sum(layers)
    begins = [it.start + it.schedule_time + it.prepare_time for it in iterations]
    return pd.DataFrame([(s, k, begin + share[s] * it.forward_time,
                          begin + share[s + 1] * it.forward_time)
                         for k, (it, begin) in enumerate(zip(iterations, begins))
                         for s in range(len(layers))],
                        columns=list(TIMELINE_COLUMNS))


def engine_timeline(llm, num_micro_batches: int,
                    first: int | None = None) -> tuple[pd.DataFrame, bool]:
    """(spans from 0, estimated?); ``first``: the first micro-batch's number (None: the last N)."""
    executor = llm.engine.executor
    if hasattr(executor, "stage_timeline"):
        timeline = executor.stage_timeline()
        # A stage's tensor-parallel ranks compute in lock step: its first rank speaks for it.
        kept_columns = [c for c in (*TIMELINE_COLUMNS, *HOST_COLUMNS) if c in timeline.columns]
        timeline = timeline.sort_values("rank").drop_duplicates(["stage", "micro_batch"])
        timeline = timeline[kept_columns]
        numbers = sorted(timeline.micro_batch.unique())
        kept = ([m for m in numbers if first <= m < first + num_micro_batches] if first is not None
                else numbers[-num_micro_batches:] if num_micro_batches else [])
        timeline = timeline[timeline.micro_batch.isin(kept)].copy()
        timeline["micro_batch"] = timeline.micro_batch.map({m: i for i, m in enumerate(kept)})
        return timeline.sort_values(["micro_batch", "stage"]).reset_index(drop=True), False
    from sarathi_lab.model.parallel.stages import Stage

    stages, total = llm.config.pipeline_parallel, llm.model_config.num_hidden_layers
    layers = [Stage.of(total, stages, s).num_layers for s in range(stages)]
    log.warning("the executor records no stage timeline: each stage's spans are estimated from "
                "the iterations (one micro-batch in flight), not measured")
    its = llm.metrics.iterations[-num_micro_batches:] if num_micro_batches else []
    return estimated_timeline(its, layers), True


def spans(timeline: pd.DataFrame, stages: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, end): [stages, micro-batches] seconds from a timeline's rows."""
    n = int(timeline.micro_batch.max()) + 1 if len(timeline) else 0
    start, end = np.full((stages, n), np.nan), np.full((stages, n), np.nan)
    at = timeline.stage.to_numpy(int), timeline.micro_batch.to_numpy(int)
    start[at] = timeline.start_s.to_numpy(float)
    end[at] = timeline.end_s.to_numpy(float)
    if np.isnan(start).any():
        raise ValueError("the stage timeline misses a micro-batch on some stage: "
                         "every micro-batch runs on every stage")
    return start, end
