from dataclasses import dataclass

from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.scheduler.base import Scheduler, SchedulerConfig, register_scheduler


@dataclass(frozen=True, kw_only=True)
class VLLMConfig(SchedulerConfig):
    # None: no cap, a backlog prefilled in one iteration (sarathi-serve's baseline: max_model_len).
    max_num_batched_tokens: int | None = None


@register_scheduler("vllm")
class VLLMScheduler(Scheduler):
    """Prefill first: whole prompts while they wait and fit, else decode-only iterations."""

    Config = VLLMConfig
    config: VLLMConfig
    prefills_whole_prompts = True

    @classmethod
    def largest_iteration_tokens(cls, config: VLLMConfig) -> int | None:
        # Prompts up to the cap, or one longer prompt alone; or a decode per request.
        cap = config.max_num_batched_tokens
        return None if cap is None else max(cap, config.max_model_len, config.max_batch_size)

    def compose(self, batch: ScheduledBatch) -> None:
        self._schedule_whole_prefills(batch, self.config.max_num_batched_tokens)
        if not batch.prefills:
            self._schedule_decodes(batch)
