"""A workload served by the engine's own loop over the simulated pipeline's stages, and the bubble
time of its micro-batches and requests by the one definition (engine/bubbles.py) a measured pipeline
shares (docs/sim/README.md, section 2)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sarathi_lab.engine.bubbles import micro_batch_bubbles, request_bubbles
from sarathi_lab.engine.clock import VirtualClock
from sarathi_lab.engine.llm_engine import LLMEngine
from sarathi_lab.engine.metrics import Metrics
from sarathi_lab.engine.scheduler import Scheduler
from sarathi_lab.engine.sequence import SamplingParams, Sequence
from sarathi_lab.sim.executor import SimulatedPipelineExecutor, StageCosts


@dataclass
class PipelineRun:
    metrics: Metrics
    request_bubble_s: np.ndarray   # per request, in request order
    micro_bubble_s: np.ndarray     # per micro-batch, in the order they entered stage 0
    stage_busy_s: list[float]
    # [stages, micro-batches]: when each micro-batch ran on each stage (the bubbles' timeline).
    stage_start_s: np.ndarray
    stage_end_s: np.ndarray

    @property
    def makespan_s(self) -> float:
        return self.metrics.summary()["makespan_s"]

    @property
    def num_micro_batches(self) -> int:
        return len(self.micro_bubble_s)


def serve_pipeline(scheduler: Scheduler, cost: StageCosts, lengths: list[tuple[int, int]],
                   arrivals: list[float] | None = None, depth: int | None = None,
                   collect_as_leaves: bool = False) -> PipelineRun:
    """Requests of (prompt, decode) at ``arrivals``, ``depth`` micro-batches in flight, each
    collected as it leaves the last stage or when the pipeline is full (the executor's
    ``collect_as_leaves``)."""
    arrivals = [0.0] * len(lengths) if arrivals is None else list(arrivals)
    seqs = [Sequence(i, [1] * p, d, a) for i, ((p, d), a) in enumerate(zip(lengths, arrivals))]
    clock = VirtualClock()
    executor = SimulatedPipelineExecutor(cost, clock, depth=depth,
                                         collect_as_leaves=collect_as_leaves)
    metrics = Metrics()
    LLMEngine(scheduler, executor, clock).run(seqs, metrics, SamplingParams())
    spans = executor.stage_spans
    start = np.array([b for b, _ in spans]).T.reshape(cost.stages, len(spans))
    end = np.array([e for _, e in spans]).T.reshape(cost.stages, len(spans))
    bubbles = micro_batch_bubbles(start, end, executor.waiting_since)
    # Micro-batches leave in entry order: the engine's iterations are theirs, in order.
    riders = [(*it.prefill_request_ids, *it.decode_request_ids) for it in metrics.iterations]
    return PipelineRun(metrics, request_bubbles(bubbles, riders, len(seqs)), bubbles,
                       list(executor.stage_busy_s), start, end)
