from dataclasses import dataclass
from typing import ClassVar

from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.scheduler.base import Scheduler, SchedulerConfig, register_scheduler
from sarathi_lab.engine.sequence import Status


@dataclass(frozen=True, kw_only=True)
class SarathiServeConfig(SchedulerConfig):
    # Decodes included, so a spent budget is exactly `token_budget` tokens (whole tiles where it is
    # a tile multiple): no chunk_align knob. The engine's chunk_size, in Sarathi-Serve's word.
    token_budget: int
    reads_as: ClassVar[dict[str, str]] = {"token_budget": "chunk_size"}


@register_scheduler("sarathi_serve")
class SarathiServeScheduler(Scheduler):
    """Stall-free batching: decodes first, never paused, then chunks until the budget is spent."""

    Config = SarathiServeConfig
    config: SarathiServeConfig

    @classmethod
    def largest_iteration_tokens(cls, config: SarathiServeConfig) -> int:
        # The budget, and the running decodes, which are never paused even past it.
        return config.token_budget + config.max_batch_size

    def compose(self, batch: ScheduledBatch) -> None:
        prefilling = self._schedule_decodes(batch)
        budget = self.config.token_budget - batch.num_decode_tokens
        for seq in prefilling:
            if budget <= 0:
                return
            if seq.status is not Status.RUNNING:  # preempted while reserving for an earlier chunk
                continue
            budget -= self._schedule_chunk(seq, budget, batch)
        while budget > 0 and self.waiting and len(self.running) < self.config.max_batch_size:
            scheduled = self._schedule_chunk(self.waiting[0], budget, batch)
            if not scheduled:
                break
            budget -= scheduled

    def likely_chunks(self, num_decodes: int, uncomputed: list[int]) -> list[int]:
        """compose's budget walk over the ongoing prefills, nothing scheduled."""
        budget, sizes = self.config.token_budget - num_decodes, []
        for left in uncomputed:
            sizes.append(max(0, min(left, budget)))
            budget -= sizes[-1]
        return sizes
