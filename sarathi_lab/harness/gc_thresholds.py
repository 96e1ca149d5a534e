"""Fewer GCs where the executor's kind asks (a simulated run: few cycles); a real run keeps the
defaults: pauses land in times."""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def fewer_collections(gen0_threshold: int | None) -> Iterator[None]:
    """``gen0_threshold``: allocations between two collections of the youngest generation
    (CPython's default: 700); None: as they are."""
    before = gc.get_threshold()
    if gen0_threshold is not None:
        gc.set_threshold(gen0_threshold, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
