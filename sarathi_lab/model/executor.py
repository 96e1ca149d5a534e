"""The real executor: a scheduled batch -> tensors -> the model's forward pass -> sampled tokens."""
from __future__ import annotations

import torch

from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.clock import Clock
from sarathi_lab.engine.executor import Executor, StepOutput
from sarathi_lab.engine.sequence import SamplingParams
from sarathi_lab.model.runner import ModelRunner
from sarathi_lab.model.sampler import Sampler


class ModelExecutor(Executor):
    def __init__(self, runner: ModelRunner, clock: Clock):
        self.runner = runner
        self.clock = clock
        self.cuda = runner.device.type == "cuda"
        self.sampler = Sampler(SamplingParams())

    def start(self, sampling: SamplingParams) -> None:
        self.sampler = Sampler(sampling)

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        clock = self.clock
        t0 = clock.now()
        prepared = self.runner.prepare(batch)
        t1 = clock.now()
        if self.cuda:
            # Device time of the forward alone, without the host's launch gaps before it.
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            logits = self.runner.forward(prepared)
            end.record()
            end.synchronize()
            forward_s = start.elapsed_time(end) / 1e3
            t2 = clock.now()
        else:
            logits = self.runner.forward(prepared)
            t2 = clock.now()
            forward_s = t2 - t1
        # Greedy rows need no keys: building them read every request's state again, after the
        # forward pass had flushed it from the caches.
        keys = None if self.sampler.greedy else [(s.sample_key, s.num_generated) for s in batch.sampled]
        tokens = self.sampler(logits, keys)
        t3 = clock.now()
        return StepOutput(tokens, prepare_s=t1 - t0, forward_s=forward_s, sample_s=t3 - t2)
