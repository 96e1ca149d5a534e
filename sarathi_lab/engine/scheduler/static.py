from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.scheduler.base import Scheduler, register_scheduler


@register_scheduler("static")
class StaticScheduler(Scheduler):
    """Request-level batching (FasterTransformer): admit a batch, prefill it, decode it until every
    request in it has finished; only then admit the next batch. Each request reserves the blocks of
    max_model_len tokens when admitted."""

    reserves_max_model_len = True
    prefills_whole_prompts = True

    def compose(self, batch: ScheduledBatch) -> None:
        if self.running:
            self._schedule_decodes(batch)
        else:
            self._schedule_whole_prefills(batch)
