from dataclasses import dataclass

from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.scheduler.base import Scheduler, SchedulerConfig, register_scheduler


@dataclass(frozen=True, kw_only=True)
class OrcaConfig(SchedulerConfig):
    # None: every free slot's prompt joins the iteration (Orca's iteration-level scheduling);
    # 1: SARATHI's best-case Orca, one whole prompt an iteration beside the running decodes.
    max_prompts: int | None = None


@register_scheduler("orca")
class OrcaScheduler(Scheduler):
    """Iteration-level hybrid batching: whole prompts beside every running decode."""

    Config = OrcaConfig
    config: OrcaConfig
    reserves_max_model_len = True
    prefills_whole_prompts = True

    def compose(self, batch: ScheduledBatch) -> None:
        self._schedule_decodes(batch)
        self._schedule_whole_prefills(batch, max_prompts=self.config.max_prompts)
