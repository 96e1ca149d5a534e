"""The engine's records as arrow tables typed as pandas would write them, without pandas."""
from __future__ import annotations

from itertools import chain

import numpy as np
import pyarrow as pa

from sarathi_lab.engine.metrics import Metrics


def engine_tables(metrics: Metrics) -> dict[str, pa.Table]:
    rows = metrics.request_rows()
    requests = {name: [row[name] for row in rows] for name in (rows[0] if rows else ())}
    tables = (("iterations", metrics.iteration_columns()), ("requests", requests))
    return {name: pa.table({k: _column(v) for k, v in columns.items()})
            for name, columns in tables}


def _column(values) -> pa.Array:
    """As pandas writes a column: NaN and None as nulls, ints beside None as floats, lists."""
    if isinstance(values, np.ndarray) and values.dtype != object:
        return _numbers(values)
    values = list(values)
    if values and isinstance(values[0], (tuple, list)):
        offsets = np.zeros(len(values) + 1, np.int32)
        np.cumsum(np.fromiter(map(len, values), np.int64, len(values)), out=offsets[1:])
        items = list(chain.from_iterable(values))
        child = _column(items) if items else pa.nulls(0)
        return pa.ListArray.from_buffers(pa.list_(child.type), len(values),
                                         [None, pa.py_buffer(offsets)], children=[child])
    numbers = np.array(values)  # in C: int64 or float64 where every value is a number, else objects
    if numbers.dtype.kind in "if":
        return _numbers(numbers)
    present = [v for v in values if v is not None]
    if not present:
        return pa.nulls(len(values))
    if set(map(type, present)) <= {int, float}:
        return _numbers(np.array([np.nan if v is None else v for v in values], dtype=np.float64))
    return pa.array(values, from_pandas=True)  # no record's column: pyarrow's own conversion


def _numbers(array: np.ndarray) -> pa.Array:
    dtype, kind = {"i": (np.int64, pa.int64()), "f": (np.float64, pa.float64())}[array.dtype.kind]
    array = np.ascontiguousarray(array, dtype=dtype)
    nan = np.isnan(array) if dtype is np.float64 else None
    valid = (pa.py_buffer(np.packbits(~nan, bitorder="little"))
             if nan is not None and nan.any() else None)

    return pa.Array.from_buffers(kind, len(array), [valid, pa.py_buffer(array)])
