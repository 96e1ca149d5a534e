"""The simulated executor on the virtual clock; tokens are never EOS (stops are unpredictable)."""
from __future__ import annotations

from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.clock import VirtualClock
from sarathi_lab.engine.executor import Executor, StepOutput
from sarathi_lab.sim.cost_model import CostModel


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
