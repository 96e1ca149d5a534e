"""The real executor: batch -> tensors -> forward -> sampled tokens."""
from __future__ import annotations

import time

import torch

from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.clock import Clock
from sarathi_lab.engine.executor import Executor, StepOutput
from sarathi_lab.model.cuda_graphs import CudaGraphs
from sarathi_lab.model.runner import ModelRunner, PreparedBatch
from sarathi_lab.model.sampler import Samples


class ModelExecutor(Samples, Executor):
    def __init__(self, runner: ModelRunner, clock: Clock, graphs: CudaGraphs | None = None):
        self.runner = runner
        self.clock = clock
        self.graphs = graphs
        self.cuda = runner.device.type == "cuda"
        self._events = ((torch.cuda.Event(enable_timing=True),
                         torch.cuda.Event(enable_timing=True)) if self.cuda else None)
        # Only where the device runs ahead of the host: else planning ahead only adds host time.
        self.plans_ahead = self.cuda

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        clock = self.clock
        t0 = clock.now()
        prepared = self.runner.prepare(batch)
        # Greedy tokens from the LM head's kernel where it can (the CPU's few-row linear); the
        # argmax's time counts as forward time.
        fused = self.sampler.greedy and self.runner.fuses_argmax(prepared)
        if self.cuda:
            # perf_counter without WallClock's device sync, which would wait for the inputs' copy
            # the launches are meant to overlap.
            t1 = time.perf_counter()
            # Device time of the forward alone, without the host's launch gaps before it.
            start, end = self._events
            start.record()
            output = self.forward(prepared, fused)
            end.record()
            if self.plans_ahead:
                self.plan_ahead(batch)
            end.synchronize()
            forward_s = start.elapsed_time(end) / 1e3
            t2 = clock.now()
        else:
            t1 = clock.now()
            output = self.forward(prepared, fused)
            t2 = clock.now()
            forward_s = t2 - t1
            if self.plans_ahead:
                self.plan_ahead(batch)
        tokens = output if fused else self.sample(output, batch.sampled)
        t3 = clock.now()
        return StepOutput(tokens, prepare_s=t1 - t0, forward_s=forward_s, sample_s=t3 - t2)

    def forward(self, prepared: PreparedBatch, fused: bool = False):
        graph = None if self.graphs is None or fused else self.graphs.graph_for(prepared)
        return (self.runner.forward(prepared, fused) if graph is None
                else self.graphs.replay(prepared, graph))

    def plan_ahead(self, batch: ScheduledBatch) -> None:
        """The likely next batch planned during this forward: if it comes, a cache hit."""
        likely = self.likely_next(batch) if self.likely_next is not None else None
        if likely is not None:
            self.runner.warm(likely)
