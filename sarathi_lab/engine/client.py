"""A serving run's client (vLLM's bench serve): the one home of the ``max_concurrency`` rule."""
from __future__ import annotations

import gc
import math
from collections.abc import Callable
from typing import Protocol

from sarathi_lab.engine.metrics import IterationRecord
from sarathi_lab.engine.sequence import Sequence


class Served(Protocol):
    def add_request(self, seq: Sequence) -> None: ...
    def advance(self) -> tuple[bool, IterationRecord | None]: ...
    def has_work(self) -> bool: ...
    def in_system(self) -> int: ...
    def elapsed(self) -> float: ...
    def wait_until(self, elapsed_s: float) -> None: ...
    def abandon(self) -> None: ...


def serve(engine: Served, seqs: list[Sequence],
          on_iteration: Callable[[IterationRecord], None] | None = None,
          max_concurrency: int | None = None) -> None:
    """Whatever stops the run, no request stays behind; one due at the cap comes as one finishes."""
    pending = sorted(seqs, key=lambda s: s.priority)
    # Startup objects outlive the run: frozen from full collections (as vLLM does), thawed after.
    gc.freeze()
    try:
        next_arrival = 0
        # Requests join and leave only between steps, so a capped client's send times follow from
        # the last check's count: one due during the step was on time only while the system stayed
        # under the cap.
        last_check, in_step = -math.inf, 0
        while next_arrival < len(pending) or engine.has_work():
            now = engine.elapsed()
            on_time = 0
            while next_arrival < len(pending) and pending[next_arrival].arrival <= now:
                if max_concurrency is not None:
                    if engine.in_system() >= max_concurrency:
                        break
                    seq = pending[next_arrival]
                    if seq.arrival <= last_check or in_step + on_time >= max_concurrency:
                        seq.arrival = now
                    else:
                        on_time += 1
                engine.add_request(pending[next_arrival])
                next_arrival += 1
            if max_concurrency is not None:
                last_check, in_step = now, engine.in_system()
            moved, record = engine.advance()
            if not moved:
                if next_arrival == len(pending):
                    raise RuntimeError("scheduler produced an empty batch with requests left "
                                       "and none to arrive")
                engine.wait_until(pending[next_arrival].arrival)
            elif on_iteration is not None and record is not None:
                on_iteration(record)
    except BaseException:
        engine.abandon()
        raise
    finally:
        gc.unfreeze()
