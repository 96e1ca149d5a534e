"""The suite's CSV tables as a reader takes them: every column it names present, every cell it reads
a value of its column's kind, or a one-line RecordError naming the file, the line and the column.
Read through gpu_records.read_bytes: a regular file, under the suite's size cap."""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sarathi_lab.analysis.gpu_records import RecordError, csv_rows, invalid, read_bytes, shown


@dataclass(frozen=True)
class Kind:
    """``parse`` raises ValueError on a cell that is no value of this kind."""
    parse: Callable[[str], Any]
    allowed: str


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def _at_least(convert, least, strictly: bool):
    def parse(text: str):
        value = convert(text)
        if value < least or (strictly and value == least):
            raise ValueError(text)
        return value
    return parse


def _text(text: str) -> str:
    return text


TEXT = Kind(_text, "text")
COUNT = Kind(_at_least(int, 1, False), "an integer >= 1")
INDEX = Kind(_at_least(int, 0, False), "an integer >= 0")
# A time a kernel took: physical, so finite and above zero.
MS = Kind(_at_least(_finite, 0.0, True), "a time in ms: a finite number > 0")
RATIO = Kind(_at_least(_finite, 0.0, False), "a finite number >= 0")


def table(data: bytes, where: str, columns: Mapping[str, Kind],
          optional: frozenset[str] = frozenset(),
          rows_read: Callable[[dict[str, str]], bool] = lambda row: True) -> list[dict[str, Any]]:
    """The rows ``rows_read`` keeps (it sees the cells as text), each column parsed; a column in
    ``optional`` may be empty there (None: not measured). Columns not named stay text."""
    rows, header = csv_rows(data, where)
    if missing := [c for c in columns if c not in header]:
        raise RecordError(f"{where} is invalid: it has no column {missing[0]!r} (its header: "
                          f"{shown(header)}): must name {', '.join(columns)}")
    found = []
    for line, row in enumerate(rows, 2):
        if None in row:
            raise invalid(where, f"line {line}", row[None],
                          f"no more cells than its header's {len(header)}")
        if not rows_read(row):
            continue
        typed: dict[str, Any] = dict(row)
        for name, kind in columns.items():
            text = row[name] if row[name] is not None else ""
            if text == "" and name in optional:
                typed[name] = None
                continue
            try:
                typed[name] = kind.parse(text)
            except ValueError:
                raise invalid(where, f"line {line}, {name}", text, kind.allowed) from None
        found.append(typed)
    return found


def read_table(path: Path, columns: Mapping[str, Kind], optional: frozenset[str] = frozenset(),
               rows_read: Callable[[dict[str, str]], bool] = lambda row: True) -> list[dict]:
    return table(read_bytes(path), str(path), columns, optional, rows_read)
