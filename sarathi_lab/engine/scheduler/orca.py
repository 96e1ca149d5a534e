from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.scheduler.base import Scheduler, register_scheduler


@register_scheduler("orca")
class OrcaScheduler(Scheduler):
    """Iteration-level hybrid batching: whole prompts beside every running decode."""

    reserves_max_model_len = True
    prefills_whole_prompts = True

    def compose(self, batch: ScheduledBatch) -> None:
        self._schedule_decodes(batch)
        self._schedule_whole_prefills(batch)
