"""The L2 flush between isolated timed calls (engine/timer.py) evicts by reading: a write would leave
dirty lines whose write-back lands in the timed kernel, which a kernel inside an iteration never pays.
On CUDA every timed call of ``time_interleaved`` follows a flush."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sarathi_lab.engine import timer


class Writes(TorchDispatchMode):
    """The number of elements of every tensor an op writes (its outputs)."""

    def __init__(self):
        super().__init__()
        self.written: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.written.append((str(func), t.numel()))
        return out


def test_the_flush_reads_the_whole_buffer_and_writes_one_element():
    buffer = torch.arange(1 << 16, dtype=torch.float32)
    flush = timer.reading_flush(buffer)
    version = buffer._version
    with Writes() as mode:
        out = flush()
    assert buffer._version == version                 # the buffer is not written
    assert mode.written and all(n <= 1 for _, n in mode.written)
    assert out.item() == buffer.sum().item()          # every element read
    assert timer.FLUSH_BYTES >= 4 * 60e6               # several times a Hopper's L2


def test_the_flush_is_none_off_cuda():
    assert timer.l2_flush("cpu") is None


class _Event:
    def __init__(self, enable_timing=False):
        self.at = None

    def record(self):
        self.at = len(_Event.log)
        _Event.log.append("event")

    def elapsed_time(self, end):
        return float(end.at - self.at)


def test_on_cuda_every_timed_call_follows_a_flush(monkeypatch):
    _Event.log = log = []
    monkeypatch.setattr(timer, "l2_flush", lambda device: lambda: log.append("flush"))
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append("sleep"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    calls = {name: (lambda n=name: log.append(n)) for name in "ab"}
    times = timer.time_interleaved(calls, reps=2, device=torch.device("cuda"), warmup=1)
    timed = log[2:]                                    # after one warmup call of each
    assert timed == ["sleep", "flush", "event", "a", "event", "flush", "event", "b", "event",
                     "sleep", "flush", "event", "b", "event", "flush", "event", "a", "event"]
    # The events bracket the call alone: the flush is outside the timed span.
    assert times == {"a": [2.0, 2.0], "b": [2.0, 2.0]}
