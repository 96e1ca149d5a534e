"""A run's progress: a tqdm bar on a terminal, a periodic log line otherwise."""
from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

from tqdm import tqdm

from sarathi_lab.engine.metrics import IterationRecord, Metrics
from sarathi_lab.harness.interrupts import raise_if_interrupted

log = logging.getLogger(__name__)


def progress_line(*fields: str) -> str:
    """A progress line of its fields, as a run's and the GPU suite's own run (measure/gpu/own.py)
    print theirs."""
    return " | ".join(fields)


class Progress:
    def __init__(self, total_tokens: int, num_requests: int, live_metrics: Callable[[], Metrics],
                 interactive: bool | None = None):
        self._num_requests = num_requests
        self._live_metrics = live_metrics
        interactive = sys.stderr.isatty() if interactive is None else interactive
        self._bar = (tqdm(total=total_tokens, unit="tok", desc="generate", leave=False)
                     if interactive else None)
        self._interval_s = 0.5 if interactive else 10.0
        self._start = self._last = time.monotonic()
        self._iterations = self._tokens = 0

    def __call__(self, record: IterationRecord) -> None:
        raise_if_interrupted()  # a signal whose exception something swallowed
        self._iterations += 1
        self._tokens += record.num_tokens
        if self._bar is not None:
            # Preempted requests recompute past the total (tqdm warns): the bar grows to the work.
            self._bar.total = max(self._bar.total, self._bar.n + record.num_tokens)
            self._bar.update(record.num_tokens)
        now = time.monotonic()
        if now - self._last < self._interval_s:
            return
        self._last = now
        done = sum(r.finish is not None for r in self._live_metrics().requests)
        fields = (f"iter {self._iterations}", f"{done}/{self._num_requests} requests done")
        if self._bar is not None:
            # the bar shows tokens/s itself
            self._bar.set_postfix_str(progress_line(*fields), refresh=False)
        else:
            log.info("%s", progress_line(*fields,
                                         f"{self._tokens / (now - self._start):.0f} tok/s"))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
