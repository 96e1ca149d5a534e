"""The seam between the engine loop and what runs a batch: the real model, or a simulator. Nothing
outside an executor may assume a real model exists."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.sequence import SamplingParams


class StepOutput(NamedTuple):
    """A tuple: immutable, as a frozen dataclass, and cheaper to make, as one is every iteration."""
    tokens: list[int]  # tokens[i] is the new token of batch.sampled[i]
    # Seconds on the engine's clock: tensors built, forward pass (device time), sampling.
    prepare_s: float
    forward_s: float
    sample_s: float


class Executor(ABC):
    def start(self, sampling: SamplingParams) -> None:
        """A new generate call begins: sample with these parameters (nothing to do for an executor whose
        tokens they do not change: a simulator's are fixed)."""

    @abstractmethod
    def execute(self, batch: ScheduledBatch) -> StepOutput:
        """Run one iteration. Reads the requests' state, never changes it (the scheduler does)."""


class PipelineExecutor(Executor):
    """An executor whose batches pass through pipeline stages: up to ``depth`` micro-batches are
    submitted before the oldest one's tokens are collected, so that every stage has one to run. The
    engine holds a submitted batch's requests out of scheduling until its tokens are collected."""

    depth: int

    @abstractmethod
    def submit(self, batch: ScheduledBatch) -> None:
        """Send ``batch`` into the pipeline; returns once the first stage may take the next one."""

    @abstractmethod
    def collect(self) -> StepOutput:
        """The tokens of the oldest batch submitted and not collected yet (waiting for them)."""

    @abstractmethod
    def drain(self) -> None:
        """Wait for every batch in flight and drop their tokens (a run that stops early)."""

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        self.submit(batch)
        return self.collect()
