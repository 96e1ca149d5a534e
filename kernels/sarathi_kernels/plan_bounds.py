"""Lower bounds on the critical paths of chunk_plan.py's candidate plans, so that a candidate that
cannot beat the best plan so far is not built (the same plan, fewer numpy calls), and the flat
grid's critical path itself. Each bound holds for the float sums the plan's path takes."""
from __future__ import annotations

import heapq

import numpy as np


def tail_bound(k: np.ndarray, programs: int, base: float) -> float:
    """No ``_tail`` plan is shorter: its busiest slot's whole walks (added to before any tail piece,
    so the same float sum), or every walk's cost spread evenly (inf: no tail plan)."""
    whole = len(k) // programs * programs
    if whole == 0 or whole == len(k):
        return np.inf
    load = np.bincount(np.arange(whole) % programs, weights=k[:whole] + base, minlength=programs)
    return max(float(load.max()), below(float((k + base).sum()) / programs))


def flat_bound(k: np.ndarray, share_count: int, split_cost: float, programs: int, base: float):
    """Lower bounds on ``_flat``'s critical path: its longest piece, or past one wave the two least
    of its longest ``programs + 1`` pieces (some slot runs two of them); and its pieces' total
    spread evenly over the slots."""
    split = split_cost if share_count > 1 else 0.0
    _, po, hi = shares(k, share_count)
    cost = hi - po + base + split  # summed as _flat sums its costs
    longest = float(cost.max(initial=0.0))
    if len(cost) > programs:
        pair = -np.partition(-cost, (programs - 1, programs))[programs - 1: programs + 1]
        longest = max(longest, below(float(pair.sum()), exact_sums(base, split)))
    return longest, below((float(k.sum()) + len(k) * share_count * (base + split)) / programs)


def shares(k: np.ndarray, share_count: int) -> tuple[np.ndarray, ...]:
    """Each walk in ``share_count`` equal shares of its key tiles (paged_attention's split): the
    shares' walks, first and end key tiles."""
    j = np.tile(np.arange(share_count), len(k))
    pw = np.repeat(np.arange(len(k)), share_count)
    return pw, j * k[pw] // share_count, (j + 1) * k[pw] // share_count


def below(bound: float, exact: bool = False) -> float:
    """A bound taken a hair lower: the float sums it bounds may round below it. ``exact``: sums of
    whole numbers of key tiles, exact as they are."""
    return bound if exact else bound * (1 - 1e-9) - 1e-9


def exact_sums(base: float, split_cost: float) -> bool:
    """Whether every cost is a whole number of key tiles: its float sums exact, bounds with no slack."""
    return float(base).is_integer() and float(split_cost).is_integer()


def widest(cut_at: np.ndarray, total: float, base: float, split_cost: float) -> float:
    """The widest span between consecutive cuts, in cost units (``below``): no bound (-inf) unless
    the cuts lie on whole key tiles (a whole base cost), where a walk ends exactly where the next
    starts and a program's pieces cover exactly the span between its cuts."""
    if not float(base).is_integer():
        return -np.inf
    spans = np.diff(np.concatenate([[0.0], np.sort(cut_at), [total]]))
    return below(float(spans.max()), exact_sums(base, split_cost))


def flat_path(costs: np.ndarray, slots: int) -> float:
    """The critical path of one program per walk (costs sorted longest first, as the grid runs them)
    on ``slots`` slots, each program onto the slot that frees first: the walks of equal cost placed
    together (a GPU batch has few distinct walks), each group on the earliest free times, the slots
    kept as counts by the time they free (few distinct times: a heap of them, not of slots)."""
    if len(costs) <= slots:  # a slot each
        return float(np.max(costs, initial=0.0))
    frees = {0.0: slots}
    values, counts = np.unique(costs, return_counts=True)
    for cost, n in zip(values[::-1].tolist(), counts[::-1].tolist()):
        # (when its next walk of this cost starts, when it was free before them, walks so far, slots)
        heap = [(free, free, 0, m) for free, m in frees.items()]
        heapq.heapify(heap)
        while n:
            start, free, taken, m = heapq.heappop(heap)
            now = min(m, n)
            n -= now
            if m > now:
                heapq.heappush(heap, (start, free, taken, m - now))
            heapq.heappush(heap, (free + cost * (taken + 1), free, taken + 1, now))
        frees = {}
        for start, _, _, m in heap:
            frees[start] = frees.get(start, 0) + m
    return max(frees)
