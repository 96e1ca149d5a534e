"""A simulated run collects its youngest generation less often, a run on a device as by default, and
the thresholds are back as they were after either, whatever happened inside."""
from __future__ import annotations

import gc

import pytest

from sarathi_lab.harness.gc_thresholds import SIM_GEN0_THRESHOLD, fewer_collections


@pytest.mark.parametrize("simulated", [True, False])
def test_thresholds_inside_and_after(simulated):
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), fewer_collections(simulated):
        inside = gc.get_threshold()
        raise RuntimeError("a run that failed")
    assert inside == ((SIM_GEN0_THRESHOLD, *before[1:]) if simulated else before)
    assert gc.get_threshold() == before
