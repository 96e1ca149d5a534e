"""A lease's claims rows written before two-sided verdicts, judged by analysis/verdict.py from the
numbers their own text states (a collected lease folder is never rewritten), and, where the lease
kept them, from its runs: the sweep table its step's log printed.

Each reader takes what its result's ``claims`` wrote into ``ours`` and hands the numbers to the
same point functions that result judges its runs with; a row it cannot read keeps its recorded
verdict, marked as not re-judged."""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from sarathi_lab.analysis import derive, gpu_records
from sarathi_lab.analysis.paper_results import (
    chunk_overhead,
    decode_speedup,
    orca_compare,
    pd_ratio,
    per_token_cost,
    tile_quantization,
)
from sarathi_lab.analysis.verdict import SIZE, Judged, combine, judge, over, versus_text
from sarathi_lab.model import load_config

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


def _layers(row: dict) -> int | None:
    model = row.get("source", "").rpartition(", ")[2]
    try:
        return load_config(model).num_hidden_layers if model else None
    except ValueError:
        return None


def _decode_over_prefill(row, folder):
    ratios = {int(b): float(x) for x, b in re.findall(rf"{X} at batch (\d+)", row["ours"])}
    return Read(per_token_cost.decode_over_prefill_points(ratios))


def _saturation(row, folder):
    coarse = re.search(r"from (\d+) tokens( \(the fewest measured\))?", row["ours"])
    fine = re.search(r"finer steps from (\d+) tokens", row["ours"])
    rate = re.search(r"([0-9.]+) tokens/ms", row["ours"])
    if not (coarse and rate):
        return None
    tokens = int(fine[1]) if coarse[2] and fine else int(coarse[1])
    fewest = bool(coarse[2]) and not fine
    point = per_token_cost.saturation_point(tokens, fewest)
    return Read([(f"saturates from {tokens} tokens", point)],
                per_token_cost.per_layer_rate(float(rate[1]), _layers(row)))


def _tile(row, folder):
    m = re.search(r"([+-][0-9.]+)% on average", row["ours"])
    return Read([("mean step", tile_quantization.jump_point(float(m[1]) / 100))]) if m else None


def _decode_speedup(row, folder):
    # The text keeps the resolved points' range, not the points: both ends judged, and where
    # aligned and fixed chunks were both run, the aligned (the paper's) range.
    m = re.search(rf"{X}-{X}", row["ours"])
    if not m:
        return None
    ends = [judge(float(g), decode_speedup.DECODE_SPEEDUP) for g in m.groups()]
    return Read([("the range's ends", over(ends))],
                "from the row's range, its points not kept by the lease: configurations the "
                "paper's A6000 does not fit (B=18 at 2K / 3K) not separable")


def _orca(row, folder):
    found = re.findall(rf"length (\d+): SARATHI(?: \(tile-aligned\))? {X}(?: \([^)]*\))?, "
                       rf"(?:SARATHI {X}(?: \([^)]*\))?, )?Orca best {X}", row["ours"])
    return Read([orca_compare.ratio_point(pd.Series([float(s)]), pd.Series([float(b)]), int(n))
                 for n, s, _, b in found]) if found else None


def _attention(row, folder):
    m = re.search(rf"chunk 64: {X} attention, {X} prefill.*? at length (\d+)", row["ours"])
    if not m:
        return None
    # The row's spread is its headline's, chunk 64's attention at the longest length.
    attention = judge(float(m[1]), chunk_overhead.CHUNK64_ATTENTION_SLOWDOWN, seeds_spread(row))
    prefill = chunk_overhead.slowdown_point(pd.Series([float(m[2])]),
                                            chunk_overhead.CHUNK64_PREFILL_SLOWDOWN)
    return Read([(f"length {m[3]} attention", attention), (f"length {m[3]} prefill", prefill)])


def _prefill_bounds(row, folder):
    length = re.search(r"at length (\d+)", row["ours"])
    found = re.findall(rf"chunk (\d+): {X} prefill", row["ours"])
    bounds = chunk_overhead.PREFILL_SLOWDOWN_BOUND
    points = [(f"length {length[1] if length else '?'} C={c}",
               chunk_overhead.slowdown_point(pd.Series([float(x)]), bounds[int(c)]))
              for c, x in found if int(c) in bounds]
    return Read(points) if points else None


def _pd_table(folder) -> tuple[pd.DataFrame, str] | None:
    """The pd_ratio points from the lease's sweep table, and the spread of its baseline."""
    table = sweep_table(folder, "pd_ratio")
    if table is None:
        return None
    base = (table[table.scheduler == derive.BASELINE].groupby(list(derive.WORKLOAD_KEYS))
            .total_throughput_tok_s.agg(["min", "max", "count"]))
    base = base[base["count"] > 1]
    apart = (base["max"] / base["min"]).max() - 1 if len(base) else None
    spread = ("its baseline's repeats (static at each chunk) up to "
              f"{apart:.0%} apart" if apart is not None else "")
    return pd_ratio.points(table), spread


def _pd_peak(row, folder):
    found = _pd_table(folder)
    if found is None:
        peaks = re.findall(rf"C=(\d+) B=(\d+): best {X} at ([0-9.]+), predicted peak ([0-9.]+)",
                           row["ours"])
        return Read([(f"C={c} B={b}", judge(float(pd_), float(pred), kind=SIZE)
                      if float(g) > 1 else Judged("no", why=f"no gain: best {float(g):.2f}x"))
                     for c, b, g, pd_, pred in peaks], "from the row's text") if peaks else None
    points, spread = found
    return Read([(name, where) for name, where, _ in pd_ratio.peak_points(points)], FROM_TABLE,
                spread)


def _pd_gain(row, folder):
    found = _pd_table(folder)
    if found is None:
        return None  # the peaks per chunk are the other row's text: no runs, no re-judging
    points, spread = found
    return Read([(name, gain) for name, _, gain in pd_ratio.peak_points(points)], FROM_TABLE,
                spread)


FROM_TABLE = ("from the lease's runs (its sweep table): static ignores the chunk, so its runs at "
              "each chunk repeat one baseline, whose range is the spread")

READERS: dict[tuple[str, str], Callable] = {
    ("per_token_cost", "At small batch"): _decode_over_prefill,
    ("per_token_cost", "Prefill throughput saturates"): _saturation,
    ("tile_quantization", "One token past"): _tile,
    ("decode_speedup", "Piggybacking raises"): _decode_speedup,
    ("orca_compare", "SARATHI beats Orca"): _orca,
    ("chunk_overhead", "Chunks of 64"): _attention,
    ("chunk_overhead", "Chunks of 256 / 512"): _prefill_bounds,
    ("pd_ratio", "The gain peaks"): _pd_peak,
    ("pd_ratio", "SARATHI gains"): _pd_gain,
}


def rejudge(row: dict, folder: Path) -> tuple[str, str, str]:
    """(holds, ours / paper, spread) of a lease's claims row: its own where it has them, else
    re-judged from its numbers, else its recorded verdict marked as not re-judged."""
    spread = row.get("spread", "")
    if row.get("ours / paper", "").strip():
        return row.get("holds", ""), row["ours / paper"], spread
    reader = next((r for (experiment, start), r in READERS.items()
                   if row.get("experiment") == experiment
                   and row.get("claim", "").startswith(start)), None)
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
