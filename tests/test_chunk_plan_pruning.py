"""chunk_plan._best builds only the candidate plans that can win (lower bounds, a pass loop that
stops once its cuts repeat) and picks the very plan the exhaustive search picks: every candidate
built, four passes of cuts each, as the planner did before the pruning."""
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sarathi_kernels import chunk_plan as cp


def exhaustive_cut(k, programs, split_cost, max_pieces, base):
    ends = np.cumsum(k + base)
    starts = ends - k - base
    total = float(ends[-1]) if len(ends) else 0.0
    floor = (float(k.max(initial=0)) + base) / (max_pieces - 1)
    inner, best = np.zeros(max(programs - 1, 0), dtype=bool), None
    for _ in range(4):
        added = (base + 2 * split_cost) * inner
        share = max((total + added.sum()) / programs, floor)
        cut = np.arange(1, programs) * share - (np.cumsum(added) - added) - split_cost * inner
        walk, off, cut_at, cut_inner = cp._cuts(ends, starts, k, cut, base)
        pieces = cp._pieces(k, starts, walk, off, cut_at, cut_inner, split_cost, programs, base)
        best = pieces if best is None or pieces[-1] < best[-1] else best
        inner = np.zeros(max(programs - 1, 0), dtype=bool)
        inner[: len(cut_inner)] = cut_inner
    return best


def exhaustive_best(k, programs, split_cost, max_pieces, base):
    best = exhaustive_cut(k, programs, split_cost, max_pieces, base)
    tail = cp._tail(k, programs, split_cost, max_pieces, base)
    best = tail if tail is not None and tail[-1] < best[-1] else best
    for share_count in range(1, min(max_pieces, int(k.min()) if len(k) else 1) + 1):
        if share_count > 1 and len(k) * share_count > cp.FLAT_WAVES * programs:
            break
        flat = cp._flat(k, share_count, split_cost, programs, base)
        best = flat if flat[-1] < best[-1] or (flat[-1] == best[-1] and share_count == 1) else best
    return best


def _same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a[:-1], b[:-1])) and a[-1] == b[-1]


walks = st.lists(st.integers(1, 60), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(keys=walks, heads=st.sampled_from([1, 2, 8, 40]), programs=st.integers(2, 400),
       split_cost=st.sampled_from([0.0, 0.5, 1.0, 1.3]), base=st.sampled_from([0.0, 1.0]),
       max_pieces=st.integers(2, 16))
# Decodes just past a wave of slots (a tail plan), and a flat grid of a few long walks.
@example(keys=[20, 19, 18, 3, 3], heads=40, programs=196, split_cost=1.0, base=0.0, max_pieces=16)
@example(keys=[60, 60], heads=8, programs=16, split_cost=1.0, base=1.0, max_pieces=16)
def test_the_pruned_search_picks_the_exhaustive_plan(keys, heads, programs, split_cost, base, max_pieces):
    k = np.repeat(np.sort(np.asarray(keys, dtype=np.int64))[::-1], heads)
    cut = cp._cut(k, programs, split_cost, max_pieces, base)
    assert _same(cut, exhaustive_cut(k, programs, split_cost, max_pieces, base))
    assert _same(cp._best(k, programs, split_cost, max_pieces, base),
                 exhaustive_best(k, programs, split_cost, max_pieces, base))


def test_a_decode_batch_builds_fewer_candidate_plans(monkeypatch):
    # 33 decodes of 40 KV heads on the H100's 396 decode slots, as plan_cost's replay meets them.
    k = np.repeat(np.arange(40, 7, -1, dtype=np.int64), 40)
    built = []
    for name in ("_pieces", "_flat"):
        real = getattr(cp, name)
        monkeypatch.setattr(cp, name, lambda *a, _real=real: built.append(1) or _real(*a))
    pruned = cp._best(k, 396, 1.0, 16, 0.0)
    searched = len(built)
    built.clear()
    assert _same(pruned, exhaustive_best(k, 396, 1.0, 16, 0.0))
    assert searched < len(built) / 1.5


def vectorised_flat_path(costs, slots):
    """flat_path as it was: a slot array, each group of equal costs on the earliest free times."""
    free = np.zeros(slots)
    values, counts = np.unique(costs, return_counts=True)
    for cost, n in zip(values[::-1], counts[::-1]):
        bound = (free.sum() + n * cost) / slots
        more = np.maximum(np.floor((bound - free) / cost).astype(np.int64) + 1, 0)
        slot = np.repeat(np.arange(slots), more)
        start = free[slot] + cost * (np.arange(len(slot)) - np.repeat(np.cumsum(more) - more, more))
        chosen = slot[np.argsort(start, kind="stable")[:n]]
        free += cost * np.bincount(chosen, minlength=slots)
    return float(free.max(initial=0.0))


@settings(max_examples=300, deadline=None)
@given(costs=st.lists(st.integers(1, 40), min_size=1, max_size=300), slots=st.integers(1, 120),
       fixed=st.sampled_from([0.0, 1.0, 1.3, 2.7]))
def test_the_flat_path_is_the_slot_by_slot_one(costs, slots, fixed):
    costs = np.sort(np.asarray(costs) + fixed)[::-1]
    # Equal within rounding: the heap adds a slot's costs one by one where the reference multiplies.
    assert cp.flat_path(costs, slots) == pytest.approx(vectorised_flat_path(costs, slots), rel=1e-12)
