"""A simulated run collects its youngest generation less often, a run on a device as by default, and
the thresholds are back as they were after either, whatever happened inside."""
from __future__ import annotations

import gc

import pytest

from sarathi_lab.executors import executor_class
from sarathi_lab.harness.gc_thresholds import fewer_collections


@pytest.mark.parametrize("executor", ["sim", "model", "vllm"])
def test_thresholds_inside_and_after(executor):
    before = gc.get_threshold()
    threshold = executor_class(executor).gc_gen0_threshold
    with pytest.raises(RuntimeError), fewer_collections(threshold):
        inside = gc.get_threshold()
        raise RuntimeError("a run that failed")
    assert inside == ((50_000, *before[1:]) if executor == "sim" else before)
    assert gc.get_threshold() == before
