from sarathi_lab.engine.batch import ScheduledBatch, ScheduledChunk
from sarathi_lab.engine.scheduler.base import Scheduler, register_scheduler
from sarathi_lab.engine.sequence import Status


@register_scheduler("static")
class StaticScheduler(Scheduler):
    """Request-level batching (FasterTransformer): admit a batch, prefill it, decode it until every
    request in it has finished; only then admit the next batch."""

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        if not self.running:
            # As many as the batch holds whose prompts fit the free blocks together: admitting more
            # would "preempt" requests that never ran.
            free = self.blocks.num_free
            for seq in self.waiting[: self.config.max_batch_size]:
                free -= self.blocks.blocks_needed(seq, seq.num_uncomputed)
                if free < 0:
                    break
                self._admit(seq)
        for seq in [s for s in self.running if s.is_prefill]:
            if seq.status is Status.RUNNING and self._reserve(seq, seq.num_uncomputed, batch):
                batch.prefills.append(ScheduledChunk(seq, seq.num_uncomputed))
        if not batch.prefills:
            self._schedule_decodes(batch)
        return batch
