"""An executor for the engine's tests that runs no model: each iteration advances a virtual clock by
what ``seconds(batch)`` says and gives every sampled request the same token."""
from __future__ import annotations

from collections.abc import Callable

from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.clock import VirtualClock
from sarathi_lab.engine.executor import Executor, StepOutput


class ClockedExecutor(Executor):
    def __init__(self, clock: VirtualClock, seconds: Callable[[ScheduledBatch], float], token: int = 0):
        self.clock, self.seconds, self.token = clock, seconds, token

    def start(self, sampling):
        pass

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        seconds = self.seconds(batch)
        self.clock.advance(seconds)
        return StepOutput([self.token] * len(batch.sampled), 0.0, seconds, 0.0)
