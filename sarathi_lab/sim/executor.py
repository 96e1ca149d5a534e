"""The simulated executors on the virtual clock; tokens are never EOS (stops are unpredictable).
With pipeline stages (``engine.sim_pp``) the engine's own loop keeps a micro-batch a stage in
flight, as on the real pipeline (``LLMEngine.advance``): ``submit`` returns when stage 0 has run the
micro-batch (the driver is a rank of stage 0), ``collect`` when the oldest one has left the last
stage and its tokens are sampled."""
from __future__ import annotations

import math
from collections import deque
from typing import NamedTuple, Protocol

from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.clock import VirtualClock
from sarathi_lab.engine.executor import Executor, PipelineExecutor, StepOutput
from sarathi_lab.sim.cost_model import CostModel
from sarathi_lab.sim.parallel import PipelineCostModel, StageTimes, through_stages


def composition(batch: ScheduledBatch) -> tuple[list[tuple[int, int]], list[int]]:
    return [(c.num_tokens, c.context_len) for c in batch.prefills], list(batch.decode_contexts)


def fixed_token(eos_token_id: int | None) -> int:
    return 1 if eos_token_id == 0 else 0


class SimulatedExecutor(Executor):
    def __init__(self, cost_model: CostModel, clock: VirtualClock, eos_token_id: int | None = None):
        self.cost_model = cost_model
        self.clock = clock
        self.token = fixed_token(eos_token_id)
        # Iterations whose prediction left the cost model's measured range.
        self.extrapolated_iterations = 0

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        prefills, decodes = composition(batch)
        num_sampled = len(batch.sampled)
        cost = self.cost_model.iteration_cost(prefills, decodes, num_sampled)
        self.extrapolated_iterations += cost.extrapolated
        self.clock.advance(cost.total_s)
        return StepOutput([self.token] * num_sampled, prepare_s=cost.prepare_s,
                          forward_s=cost.forward_s, sample_s=cost.sample_s)


class StageCosts(Protocol):
    """What a micro-batch costs each stage (parallel.PipelineCostModel, or a toy of its shape)."""
    stages: int

    def times(self, prefills: list[tuple[int, int]], decodes: list[int],
              num_sampled: int) -> StageTimes: ...


class _InFlight(NamedTuple):
    tokens: int
    start: float
    exit: float
    times: StageTimes


class SimulatedPipelineExecutor(PipelineExecutor):
    """``depth`` micro-batches in flight (default one a stage). ``waiting_since``: when stage 0
    had each one's work after waiting on an empty pipeline (NaN: it did not wait).
    ``collect_as_leaves``: each micro-batch's tokens are handed over once it has left the last
    stage, before the next is scheduled (sarathi-serve's PipelineParallelLLMEngine); False: only
    when the pipeline is full or the scheduler has nothing to give, as this engine's real
    pipeline does."""

    def __init__(self, cost: StageCosts, clock: VirtualClock, eos_token_id: int | None = None,
                 depth: int | None = None, collect_as_leaves: bool = False):
        self.cost, self.clock = cost, clock
        self.depth = depth or cost.stages
        self.collect_as_leaves = collect_as_leaves
        self.token = fixed_token(eos_token_id)
        self.stage_free = [0.0] * cost.stages
        self.stage_busy_s = [0.0] * cost.stages
        self.stage_spans: list[tuple[list[float], list[float]]] = []
        self.waiting_since: list[float] = []
        self._in_flight: deque[_InFlight] = deque()
        self._moved: float | None = None   # the clock when this executor last moved it

    def submit(self, batch: ScheduledBatch) -> None:
        now = self.clock.now()
        times = self.cost.times(*composition(batch), len(batch.sampled))
        begins, ends = through_stages(times, now, self.stage_free, self.stage_busy_s)
        self.stage_spans.append((begins, ends))
        # The clock moved past this executor's last move only by a wait for an arrival.
        idle = not self._in_flight and (self._moved is None or now > self._moved)
        self.waiting_since.append(now if idle else math.nan)
        exit_s = ends[-1] + times.return_s
        self._in_flight.append(_InFlight(len(batch.sampled), begins[0], exit_s, times))
        self.clock.sleep_until(ends[0])
        self._moved = self.clock.now()

    def oldest_left(self) -> bool:
        flight = self._in_flight
        return self.collect_as_leaves and bool(flight) and flight[0].exit <= self.clock.now()

    def collect(self) -> StepOutput:
        mb = self._in_flight.popleft()
        clock = self.clock
        clock.sleep_until(mb.exit)
        clock.advance(mb.times.sample_s)
        self._moved = clock.now()
        return StepOutput([self.token] * mb.tokens, prepare_s=mb.times.host_s,
                          forward_s=mb.exit - mb.start, sample_s=mb.times.sample_s)

    def drain(self) -> None:
        # The stages finish what they hold, so that the next run starts on an empty pipeline.
        if self._in_flight:
            self.clock.sleep_until(self._in_flight[-1].exit)
        self._in_flight.clear()
        self._moved = self.clock.now()


def simulated_executor(cost_model: CostModel, clock: VirtualClock,
                       eos_token_id: int | None = None) -> Executor:
    """``executor=sim``: pipelined over a PipelineCostModel's stages, else one at a time."""
    if isinstance(cost_model, PipelineCostModel):
        return SimulatedPipelineExecutor(cost_model, clock, eos_token_id)
    return SimulatedExecutor(cost_model, clock, eos_token_id)
