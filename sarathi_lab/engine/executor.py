"""The seam to what runs a batch: nothing outside an executor may assume a real model."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import NamedTuple

from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.next_batch import NextBatch
from sarathi_lab.engine.sequence import SamplingParams


class StepOutput(NamedTuple):
    """A tuple: immutable, and cheaper than a frozen dataclass to make every iteration."""
    tokens: list[int]  # tokens[i] is the new token of batch.sampled[i]
    prepare_s: float
    forward_s: float
    sample_s: float


class Executor(ABC):
    # The scheduler's guess at a batch's successor (Scheduler.likely_next), given by the engine: an
    # executor may plan it ahead while the device runs the batch.
    likely_next: Callable[[ScheduledBatch], NextBatch | None] | None = None

    def start(self, sampling: SamplingParams) -> None:
        """A new generate call's parameters (a simulator's tokens are fixed: nothing to do)."""

    @abstractmethod
    def execute(self, batch: ScheduledBatch) -> StepOutput:
        """Reads the requests' state, never changes it (the scheduler does)."""


class PipelineExecutor(Executor):
    """The engine holds a submitted batch's requests out of scheduling until collected."""

    depth: int

    @abstractmethod
    def submit(self, batch: ScheduledBatch) -> None:
        """Returns once the first stage may take the next batch."""

    @abstractmethod
    def collect(self) -> StepOutput:
        """The oldest uncollected batch's tokens (waiting for them)."""

    def oldest_left(self) -> bool:
        """Whether the oldest batch in flight has left the last stage and is handed over before the
        next batch is scheduled (sarathi-serve's output thread takes each as it leaves); False:
        taken only when the pipeline is full or nothing else can be scheduled."""
        return False

    @abstractmethod
    def drain(self) -> None:
        """Wait for every batch in flight, dropping their tokens (a run stopping early)."""

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        self.submit(batch)
        return self.collect()
