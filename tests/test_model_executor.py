"""The real executor's timing on CUDA, with the device faked: no GPU is needed to check what it
synchronizes on and what it reuses."""
from __future__ import annotations

import torch

from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.clock import Clock
from sarathi_lab.engine.sequence import Sequence
from sarathi_lab.model import executor as executor_module
from sarathi_lab.model.executor import ModelExecutor


class SyncingClock(Clock):
    """A wall clock that notes each reading, as each of WallClock's on CUDA synchronizes the device."""

    def __init__(self, log: list):
        self.log = log

    def now(self) -> float:
        self.log.append("sync")
        return 0.0

    def sleep_until(self, t: float) -> None:
        pass


class FakeEvent:
    made = 0

    def __init__(self, enable_timing: bool = False):
        FakeEvent.made += 1

    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other) -> float:
        return 2.5  # ms


class FakeRunner:
    device = torch.device("cuda")

    def __init__(self, log: list):
        self.log = log

    def prepare(self, batch):
        self.log.append("prepare")
        return batch

    def fuses_argmax(self, prepared) -> bool:
        return True

    def forward(self, prepared, argmax=False):
        self.log.append("forward")
        return [7] * len(prepared.decodes)


def test_on_cuda_the_forward_launches_without_waiting_for_its_inputs_copy(monkeypatch):
    # Each clock reading on CUDA synchronizes the device; one between preparing and launching the
    # forward would wait for the inputs' non-blocking copy instead of overlapping it.
    monkeypatch.setattr(executor_module.torch.cuda, "Event", FakeEvent)
    FakeEvent.made = 0
    log: list = []
    executor = ModelExecutor(FakeRunner(log), SyncingClock(log))
    batch = ScheduledBatch(decodes=[Sequence(0, [1, 2], 4, num_computed=1)])
    for _ in range(3):
        log.clear()
        out = executor.execute(batch)
        assert log == ["sync", "prepare", "forward", "sync", "sync"]
        assert out.tokens == [7] and out.forward_s == 2.5e-3
    assert FakeEvent.made == 2  # the timing events are made once, not every iteration
