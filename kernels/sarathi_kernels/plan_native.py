"""chunk_plan's planning compiled (csrc/plan/chunk_plan.cpp): the numpy planner's very work, each
candidate weighed alike and each float summed in its order, without its few hundred array calls a
plan. None where the planner library cannot be built: chunk_plan then plans in numpy."""
from __future__ import annotations

import ctypes
import functools

import numpy as np

from sarathi_kernels import cpu_build

_P, _I64, _D = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double


@functools.cache
def _fn():
    return cpu_build.function("chunk_plan_work", [_P, _P, _P, _I64, _P, _I64, *[_I64] * 4, _D, _I64, _D,
                                                  _I64, _I64, _I64, _P, _P, _P, _P, _P], _I64,
                              cpu_build.PLANNER)


def available() -> bool:
    return _fn() is not None


def planner() -> str:
    """How chunk_plan plans on this host: "compiled", or "numpy" where no library can be built."""
    return "compiled" if available() else "numpy"


def plan(walks, query_lens: np.ndarray, heads: int, block_q: int, block_n: int, programs: int,
         split_cost: float, max_pieces: int, base: float, min_piece: int, flat_waves: int):
    """``(items, work_indptr, row_splits, split_capacity, critical_path, unsplit_cost,
    planned_cost, longest_piece)`` as chunk_plan.plan_chunks makes them from the batch's
    ``walks`` (tile_walks) and query lengths; None where the library is unavailable."""
    fn = _fn()
    if fn is None:
        return None
    req, first_q, keys = (np.ascontiguousarray(a, dtype=np.int64) for a in walks)
    q = np.ascontiguousarray(query_lens, dtype=np.int64)
    n = len(keys) * heads
    # A cut plan adds at most a piece a program to the walks; a flat one stays within its waves.
    capacity = n + flat_waves * programs + 1
    items = np.empty((capacity, 8), dtype=np.int32)
    indptr = np.empty(capacity + programs + 1, dtype=np.int32)
    rows = np.empty((int(q.sum()), heads), dtype=np.int32)
    reals, ints = np.empty(4), np.empty(2, dtype=np.int64)
    pieces = fn(req.ctypes.data, first_q.ctypes.data, keys.ctypes.data, len(keys), q.ctypes.data, len(q),
                heads, block_q, block_n, programs, split_cost, max_pieces, base, min_piece, flat_waves,
                capacity, items.ctypes.data, indptr.ctypes.data, rows.ctypes.data, reals.ctypes.data,
                ints.ctypes.data)
    if pieces < 0:
        raise RuntimeError(f"chunk_plan_work: a plan of over {capacity} pieces for {n} walks on "
                           f"{programs} programs")
    path, unsplit, planned, longest = reals.tolist()
    grid, most = ints.tolist()
    return items[:pieces], indptr[: grid + 1], rows, most, path, unsplit, planned, longest
