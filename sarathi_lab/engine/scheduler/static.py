from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.scheduler.base import Scheduler, register_scheduler


@register_scheduler("static")
class StaticScheduler(Scheduler):
    """FasterTransformer's request-level batching: a new batch only once this one finished."""

    reserves_max_model_len = True
    prefills_whole_prompts = True

    def compose(self, batch: ScheduledBatch) -> None:
        if self.running:
            self._schedule_decodes(batch)
        else:
            self._schedule_whole_prefills(batch)
