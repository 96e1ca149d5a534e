"""Fewer GCs in a simulated run (few cycles); a real run keeps defaults: pauses land in times."""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

# Allocations between two collections of the youngest generation (CPython's default: 700).
SIM_GEN0_THRESHOLD = 50_000


@contextlib.contextmanager
def fewer_collections(simulated: bool) -> Iterator[None]:
    before = gc.get_threshold()
    if simulated:
        gc.set_threshold(SIM_GEN0_THRESHOLD, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
