from dataclasses import dataclass

from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.scheduler.base import Scheduler, SchedulerConfig, register_scheduler


@dataclass(frozen=True, kw_only=True)
class SarathiConfig(SchedulerConfig):
    # The prefill chunk: tokens of one request's prompt per iteration.
    chunk_size: int


@register_scheduler("sarathi")
class SarathiScheduler(Scheduler):
    """Chunked prefill with decode-maximal batching (SARATHI): every running decode plus one
    prefill chunk of ``chunk_size`` tokens, from one request at a time."""

    Config = SarathiConfig
    config: SarathiConfig

    @classmethod
    def largest_iteration_tokens(cls, config: SarathiConfig) -> int:
        return config.chunk_size + config.max_batch_size  # one chunk beside a decode per running request

    def compose(self, batch: ScheduledBatch) -> None:
        self._schedule_decodes(batch)
        ongoing = [s for s in self.running if s.is_prefill and s not in batch]
        if ongoing:
            self._schedule_chunk(ongoing[0], self.config.chunk_size, batch)
        elif self.waiting and len(self.running) < self.config.max_batch_size:
            self._schedule_chunk(self.waiting[0], self.config.chunk_size, batch)
