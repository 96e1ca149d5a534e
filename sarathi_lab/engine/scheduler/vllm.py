from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.scheduler.base import Scheduler, register_scheduler


@register_scheduler("vllm")
class VLLMScheduler(Scheduler):
    """Iteration-level and prefill-prioritising: whenever prompts wait and fit, run a prefill-only
    iteration of whole prompts, at most ``max_num_batched_tokens`` of them; otherwise a decode-only
    iteration of every running request."""

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        self._schedule_whole_prefills(batch, self.config.max_num_batched_tokens)
        if not batch.prefills:
            self._schedule_decodes(batch)
        return batch
