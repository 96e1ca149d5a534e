"""Fewer cyclic garbage collections while a simulated run builds and serves its requests: it allocates
millions of objects that live to the end (requests, their tokens, every iteration's record) and makes
almost no cycles, so the collector's youngest generation, at its default of 700 allocations, walks the
same young objects again and again for nothing. A run on a real device keeps the defaults: a larger
young generation means longer pauses, and those would land inside the times it measures."""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

# Allocations between two collections of the youngest generation (CPython's default: 700).
SIM_GEN0_THRESHOLD = 50_000


@contextlib.contextmanager
def fewer_collections(simulated: bool) -> Iterator[None]:
    """Within the block, with ``simulated``, the youngest generation collected every
    SIM_GEN0_THRESHOLD allocations; the thresholds as they were after it."""
    before = gc.get_threshold()
    if simulated:
        gc.set_threshold(SIM_GEN0_THRESHOLD, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
