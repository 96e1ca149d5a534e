"""The simulated executor: each iteration takes what the cost model predicts for the batch's
composition on the engine's virtual clock. Every sampled token is one fixed token other than EOS:
a simulation cannot predict when a model would stop, so requests run to max_new_tokens.
"""
from __future__ import annotations

from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.clock import VirtualClock
from sarathi_lab.engine.executor import Executor, StepOutput
from sarathi_lab.sim.cost_model import CostModel


def composition(batch: ScheduledBatch) -> tuple[list[tuple[int, int]], list[int]]:
    """The batch as a cost model takes it: (chunk tokens, context once the chunk is cached) per
    prefill chunk, and each decode's context with the token it computes now."""
    return [(c.num_tokens, c.context_len) for c in batch.prefills], list(batch.decode_contexts)


def fixed_token(eos_token_id: int | None) -> int:
    """The one token a simulation samples: any but EOS."""
    return 1 if eos_token_id == 0 else 0


class SimulatedExecutor(Executor):
    def __init__(self, cost_model: CostModel, clock: VirtualClock, eos_token_id: int | None = None):
        self.cost_model = cost_model
        self.clock = clock
        self.token = fixed_token(eos_token_id)
        # Iterations whose prediction left the cost model's measured range (profile cost model).
        self.extrapolated_iterations = 0

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        prefills, decodes = composition(batch)
        num_sampled = len(batch.sampled)
        cost = self.cost_model.iteration_cost(prefills, decodes, num_sampled)
        self.extrapolated_iterations += cost.extrapolated
        self.clock.advance(cost.total_s)
        return StepOutput([self.token] * num_sampled, prepare_s=cost.prepare_s,
                          forward_s=cost.forward_s, sample_s=cost.sample_s)
