"""Pipeline bubble time (SARATHI's Fig. 12), from a timeline of when each micro-batch ran on each stage:
the one definition the simulator's pipeline and the measured one share, so that their bubbles are the
same quantity.

A stage is in a bubble while it idles with work that exists for it: for stage s >= 1, the time between
its previous micro-batch's end (or the micro-batch's own start on stage 0, whichever is later) and the
micro-batch's start on s; for stage 0, the time between its previous micro-batch's end (or the moment
work for this one existed, where the system was empty before it) and the start. A micro-batch's
bubble is the sum over its stages; a request's, the sum over the micro-batches it rode in.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def micro_batch_bubbles(start: np.ndarray, end: np.ndarray, waiting_since: Sequence[float] | None = None) -> np.ndarray:
    """Stage-seconds of bubble of each micro-batch. ``start`` and ``end``: [stages, micro-batches]
    seconds on one clock, micro-batches in the order they entered stage 0 (each stage serves them in
    that order). ``waiting_since[k]``: when stage 0 had micro-batch k's work (an arrival after an empty
    spell; NaN or None: as soon as its previous micro-batch ended). The first micro-batch's stage-0
    wait counts only from ``waiting_since[0]``, as nothing ran before it."""
    start, end = np.asarray(start, float), np.asarray(end, float)
    if start.shape != end.shape or start.ndim != 2:
        raise ValueError(f"start {start.shape} and end {end.shape} must be the same [stages, micro_batches] shape")
    if start.shape[1] == 0:
        return np.zeros(0)
    # Each stage's previous finish; before the first micro-batch a stage has nothing to wait after.
    previous = np.concatenate([np.full((start.shape[0], 1), -np.inf), end[:, :-1]], axis=1)
    since = np.full(start.shape[1], np.nan) if waiting_since is None else np.asarray(waiting_since, float)
    if since.shape != (start.shape[1],):
        raise ValueError(f"waiting_since has {since.shape} entries; expected one per micro-batch ({start.shape[1]})")
    since = since.copy()
    if np.isnan(since[0]):
        since[0] = start[0, 0]
    first = start[0] - np.fmax(previous[0], since)
    later = start[1:] - np.maximum(previous[1:], start[0])
    return np.clip(first, 0.0, None) + np.clip(later, 0.0, None).sum(axis=0)


def request_bubbles(bubbles: np.ndarray, riders: Iterable[Iterable[int]], num_requests: int) -> np.ndarray:
    """Each request's bubble time: the sum of the bubbles of the micro-batches it rode in
    (``riders[k]``: the request ids, 0 .. num_requests - 1, of micro-batch k's chunks and decodes)."""
    out = np.zeros(num_requests)
    for bubble, ids in zip(bubbles, riders, strict=True):
        # A request rides a micro-batch once (one chunk or one decode), however it is listed.
        for i in set(ids):
            out[i] += bubble
    return out


def stage_busy_s(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Each stage's seconds of work."""
    return (np.asarray(end, float) - np.asarray(start, float)).sum(axis=1)
