"""Pipeline bubble time (SARATHI's Fig. 12): the one definition the simulated and measured pipelines
share. A stage is in a bubble while it idles with work that exists for it; a micro-batch's bubble
sums its stages', a request's the micro-batches' it rode in."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def micro_batch_bubbles(start: np.ndarray, end: np.ndarray,
                        waiting_since: Sequence[float] | None = None) -> np.ndarray:
    """``waiting_since[k]``: when stage 0 had micro-batch k's work (NaN: its previous one's end)."""
    start, end = np.asarray(start, float), np.asarray(end, float)
    if start.shape != end.shape or start.ndim != 2:
        raise ValueError(f"start {start.shape} and end {end.shape} must be the same "
                         f"[stages, micro_batches] shape")
    if start.shape[1] == 0:
        return np.zeros(0)
    previous = np.concatenate([np.full((start.shape[0], 1), -np.inf), end[:, :-1]], axis=1)
    since = (np.full(start.shape[1], np.nan) if waiting_since is None
             else np.asarray(waiting_since, float))
    if since.shape != (start.shape[1],):
        raise ValueError(f"waiting_since has {since.shape} entries; expected one per micro-batch "
                         f"({start.shape[1]})")
    since = since.copy()
    if np.isnan(since[0]):
        since[0] = start[0, 0]
    first = start[0] - np.fmax(previous[0], since)
    later = start[1:] - np.maximum(previous[1:], start[0])
    return np.clip(first, 0.0, None) + np.clip(later, 0.0, None).sum(axis=0)


def request_bubbles(bubbles: np.ndarray, riders: Iterable[Iterable[int]],
                    num_requests: int) -> np.ndarray:
    out = np.zeros(num_requests)
    for bubble, ids in zip(bubbles, riders, strict=True):
        # A request rides a micro-batch once (one chunk or one decode), however it is listed.
        for i in set(ids):
            out[i] += bubble
    return out


def stage_busy_s(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    return (np.asarray(end, float) - np.asarray(start, float)).sum(axis=1)
