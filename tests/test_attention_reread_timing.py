"""chunk_overhead's attention (profiling.attention.measure_reread) is timed by the measurement timer
that uses CUDA events on a GPU (engine.timer.time_interleaved), every chunk beside the whole prompt in
each round, not by a wall clock with a sync per call."""
from __future__ import annotations

import torch

from sarathi_lab.engine import timer
from sarathi_lab.measure.profiling import attention


def test_reread_sums_each_chunks_median_from_the_interleaved_timer(monkeypatch):
    seen = {}

    def fake(calls, reps, device, warmup):
        seen.update(names=list(calls), reps=reps, device=device)
        for fn in calls.values():  # each call still runs: its metadata and backend are real
            fn()
        return {name: [1.0, 3.0, 2.0] if name == "whole" else [0.5, 0.25, 0.75] for name in calls}

    monkeypatch.setattr(attention, "time_interleaved", fake)
    row = attention.measure_reread(64, 16, num_heads=2, num_kv_heads=1, head_dim=8, reps=3)
    assert seen["names"] == ["whole", "chunk0", "chunk1", "chunk2", "chunk3"] and seen["reps"] == 3
    assert row["whole_ms"] == 2.0 and row["chunked_ms"] == 4 * 0.5 and row["num_chunks"] == 4
    assert row["kv_read_ratio"] > 1


def test_the_timer_times_each_call_once_a_round_on_the_cpu():
    calls = {"a": lambda: torch.ones(4).sum(), "b": lambda: torch.zeros(4).sum()}
    times = timer.time_interleaved(calls, reps=4, device=torch.device("cpu"), warmup=0)
    assert {k: len(v) for k, v in times.items()} == {"a": 4, "b": 4}
    assert all(t >= 0 for v in times.values() for t in v)
