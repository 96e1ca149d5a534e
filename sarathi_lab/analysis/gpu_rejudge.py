"""A lease's claims rows written before two-sided verdicts, judged by analysis/verdict.py from the
numbers their own text states (a collected lease folder is never rewritten), and, where the lease
kept them, from its runs: the sweep table its step's log printed.

Each reader is its result's (``PaperResult.rejudge``, beside the ``claims`` that wrote the text):
it takes what they wrote into ``ours`` and hands the numbers to the same point functions that result
judges its runs with; a row it cannot read keeps its recorded verdict, marked as not re-judged."""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from sarathi_lab.analysis import derive, gpu_records
from sarathi_lab.analysis.verdict import Judged, combine, versus_text

X = r"([0-9.]+)x"
SEEDS = re.compile(r"([0-9.e+-]+) to ([0-9.e+-]+) over (\d+) seeds")
# A sweep table as the harness prints it at a sweep's end (steps/paper.<name>/sweep.log).
TABLE_START = "sweep_summary.csv:"
NOT_REJUDGED = "not re-judged (recorded: {holds})"


class Read(NamedTuple):
    """A row's points as a reader found them; ``spread``: where the reader found one the row's
    spread cell did not state."""
    points: list[tuple[str, Judged]]
    note: str = ""
    spread: str = ""


def seeds_spread(row: dict) -> tuple[float, float] | None:
    """The row's headline number over its seeds, where its spread gives it."""
    m = SEEDS.search(row.get("spread", ""))
    return (float(m[1]), float(m[2])) if m else None


def reader_of(row: dict, readers: dict[str, Callable]) -> Callable | None:
    """The row's reader among its result's (``PaperResult.rejudge``), by how its claim starts."""
    return next((r for start, r in readers.items() if row.get("claim", "").startswith(start)),
                None)


def rejudge(row: dict, folder: Path, readers: dict[str, Callable]) -> tuple[str, str, str]:
    """(holds, ours / paper, spread) of a lease's claims row: its own where it has them, else
    re-judged from its numbers by its result's ``readers``, else its recorded verdict marked as
    not re-judged."""
    spread = row.get("spread", "")
    if row.get("ours / paper", "").strip():
        return row.get("holds", ""), row["ours / paper"], spread
    reader = reader_of(row, readers)
    found = reader(row, folder) if reader else None
    if not found or not found.points:
        return NOT_REJUDGED.format(holds=row.get("holds", "") or "none"), "", spread
    return (combine(j.word for _, j in found.points),
            "; ".join(filter(None, [versus_text(found.points), found.note])),
            found.spread or spread)


def sweep_table(folder: Path, experiment: str) -> pd.DataFrame | None:
    """The sweep table a lease's step printed into its log, as a summary frame with the
    workload's keys its command set; None where the log has none or it cannot be read."""
    step = folder / "steps" / f"paper.{experiment}"
    try:  # the suite's reader: regular files under its cap, a FIFO never waited on
        lines = gpu_records.read_bytes(step / "sweep.log").decode(errors="replace").splitlines()
        command = gpu_records.read_bytes(step / "result.json").decode(errors="replace")
    except gpu_records.RecordError:
        return None
    starts = [i for i, line in enumerate(lines) if line.rstrip().endswith(TABLE_START)]
    if not starts:
        return None
    header, *rows = lines[starts[-1] + 1:]
    columns = header.split()
    body = []
    for line in rows:
        cells = line.split()
        if len(cells) != len(columns):
            break
        body.append(cells)
    table = pd.DataFrame(body, columns=columns)
    if not {"scheduler", "total_throughput_tok_s", "status"} <= set(columns) or table.empty:
        return None
    table = table[table.status == "ok"].copy()
    for column in table:
        numbers = pd.to_numeric(table[column], errors="coerce")
        if numbers.notna().all():
            table[column] = numbers
    # The command named the workload's fixed keys (seq_len=1024 batch_size=18 ...).
    for key in derive.WORKLOAD_KEYS:
        if key not in table and (m := re.search(rf"\b{key}=([0-9.]+)\b(?!,)", command)):
            table[key] = float(m[1])
    return table if set(derive.WORKLOAD_KEYS) <= set(table) else None
