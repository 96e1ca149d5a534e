"""A pipeline stage's times from a one-device cost model of the whole model, as
``sim/pipeline_run.py`` serves it: the layers split evenly (a profile cannot tell layers apart), the
LM head on the last stage, the driver's host work on stage 0 before its forward, and every message
(commands, activations, logits) priced by the link between the stages' processes."""
from __future__ import annotations

from dataclasses import dataclass

from sarathi_lab.sim.cost_model import CostModel, batch_tokens
from sarathi_lab.sim.handoff import Handoff
from sarathi_lab.sim.link import Link
from sarathi_lab.sim.parallel import StageTimes

# Where no measured link is given: assumed figures, a TCP message on a loopback.
LOOPBACK = Link.linear(100e-6, 2e9)
HEADER_BYTES = 80  # ten int64 counts (model/parallel/wire.py)
COMMAND_BYTES_A_TOKEN = 24  # each token's id, position and cache slot (int64)


@dataclass(frozen=True)
class ProfileStages:
    """A micro-batch's times on each stage of the model ``whole`` prices."""
    whole: CostModel
    stages: int
    hidden_bytes: int  # the residual goes with it
    link: Link = LOOPBACK
    logits_row_bytes: int = 0
    # Each stage's work between forwards, measured on a running pipeline; None: link-priced.
    handoff: Handoff | None = None

    def times(self, prefills: list[tuple[int, int]], decodes: list[int],
              num_sampled: int) -> StageTimes:
        cost = self.whole.iteration_cost(prefills, decodes, num_sampled)
        head = self.head_s(num_sampled)
        tokens = batch_tokens(prefills, decodes)
        message = self.link.message_s
        stage_s = max(cost.forward_s - head, 0.0) / self.stages
        host = {"host_s": cost.prepare_s + cost.sample_s,
                "return_s": message(num_sampled * self.logits_row_bytes)}
        h = self.handoff
        if h is None:
            command = message(HEADER_BYTES) + message(COMMAND_BYTES_A_TOKEN * tokens)
            host |= {"stage_host_s": command + cost.prepare_s,
                     "p2p_s": 2 * message(tokens * self.hidden_bytes)}
        else:  # the activations' move is in receive_s
            host |= {"stage_host_s": h.host(tokens), "first_host_s": h.first_host(tokens),
                     "after_s": h.after_s(tokens), "receive_s": h.receive(tokens), "p2p_s": 0.0}
        return StageTimes(stage_s=stage_s, last_extra_s=head, **host)

    def head_s(self, num_sampled: int) -> float:
        """Where the cost model prices the LM head apart, else 0 (split over the stages)."""
        curve = getattr(self.whole, "lm_head", None)
        if num_sampled and callable(curve):
            return float(curve(num_sampled)[0])
        return 0.0

    def describe(self) -> str:
        return (f"{self.stages} stages priced by the {getattr(self.whole, 'name', 'cost')} model "
                f"of {getattr(self.whole, 'source', type(self.whole).__name__)}: layers split "
                f"evenly, LM head last, host work on stage 0 and each stage, logits back, sends "
                f"{self.link.describe()}"
                + (f"; {self.handoff.describe()}" if self.handoff is not None else ""))
