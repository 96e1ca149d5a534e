"""The ``launch`` step's overlapped twins: each hybrid iteration large enough for nano-batches,
whole and as two nano-batches on two streams, each from a CUDA graph of that batch, over its
physical floor (``,overlap`` and ``,whole``), and the kernels per stream (timeline.csv)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from sarathi_lab.analysis.launch_grid import label
from sarathi_lab.measure.gpu.state import Metric
from sarathi_lab.measure.profiling.overlap import (
    OVERLAP,
    concurrent_ms,
    measure_overlap,
    streams_busy_ms,
)
from sarathi_lab.model.floors import floor, memory_ceiling
from sarathi_lab.model.shape import Shape

TIMELINE = "timeline.csv"
# The tuned table's ``overlap`` entry these twins measured; the tune step installs it.
ENTRY = "overlap_entry.json"
COLUMNS = ["iteration", "source", "stream", "name", "start_us", "dur_us"]
# What two nano-batches must reach over the physical floor (and faster than the whole batch).
PHYSICAL_TARGET = 1.3
REL_DIFF = 0.05


def overlapped(llm, cases, contexts, reps: int, env: dict, cuda: bool,
               out: Path) -> tuple[list[Metric], str]:
    """Every case of OVERLAP.min_tokens or more per context, the note; timelines to ``out``."""
    big = [(c, d) for c, d in cases if c and d and c + d >= OVERLAP.min_tokens]
    metrics, rows, stopped, gains = [], [], "", []
    for at in contexts:
        for chunk, decodes in big:
            key = label(chunk, decodes, None if at == contexts[0] else at)
            try:
                row, timeline = measure_overlap(llm, chunk, decodes, at, reps)
            except (RuntimeError, ValueError) as e:  # out of KV blocks or memory
                first = str(e).splitlines()[0][:200] if str(e) else ""
                stopped = f"; stopped at {key} ({type(e).__name__}: {first})"
                break
            metrics += _metrics(llm, key, chunk, decodes, at, row, env, cuda)
            metrics += _stream_metrics(key, timeline)
            gains.append((chunk + decodes, row["overlap_ms"] - row["whole_ms"]))
            rows += [{"iteration": key, **r} for r in timeline]
        if stopped:
            break
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=COLUMNS).to_csv(out / TIMELINE, index=False)
    if gains:
        (out / ENTRY).write_text(json.dumps(table_entry(gains)) + "\n")
    names = ", ".join(label(c, d) for c, d in big)
    return metrics, (
        f"overlapped twins (,overlap / ,whole): {names} at contexts "
        f"{', '.join(map(str, contexts))}, cut at half their {OVERLAP.tile}-row tiles into two "
        "nano-batches, one's attention on a side stream beside the other's GEMMs; each way a CUDA "
        f"graph of the batch itself (no bucket padding), median of {reps} interleaved; {TIMELINE}: "
        "the nano-batched forward's kernels per stream, one replay and one eager forward "
        f"(measure/profiling/overlap.py){stopped}")


def table_entry(gains: list[tuple[int, float]]) -> dict[str, bool | int]:
    """On from the fewest tokens from which every twin was faster overlapped; else off."""
    counts = sorted({t for t, _ in gains})
    won = [t for t in counts if all(g < 0 for u, g in gains if u >= t)]
    return {"enabled": True, "min_tokens": won[0]} if won else {"enabled": False}


def _metrics(llm, key: str, chunk: int, decodes: int, context: int, row: dict, env: dict,
             cuda: bool) -> list[Metric]:
    queries = [chunk] + [1] * decodes
    least = floor(Shape.of(llm.model_config), queries, [context] * len(queries), len(queries),
                  llm.dtype.itemsize, memory_ceiling(env)[0], env["matmul_tflops"] * 1e3)
    least_ms = least.seconds * 1e3
    over, whole = row["overlap_ms"] / least_ms, row["whole_ms"] / least_ms
    gain, rel = row["overlap_ms"] - row["whole_ms"], row["rel_diff"]
    return [
        Metric(f"engine_ms[{key},overlap]", round(row["overlap_ms"], 3), "ms"),
        Metric(f"engine_ms[{key},whole]", round(row["whole_ms"], 3), "ms"),
        Metric(f"engine_over_floor[{key},overlap]", round(over, 2), "x", f"<= {PHYSICAL_TARGET}",
               over <= PHYSICAL_TARGET if cuda else None),
        Metric(f"engine_over_floor[{key},whole]", round(whole, 2), "x"),
        Metric(f"overlap_gain_ms[{key}]", round(gain, 3), "ms", "< 0", gain < 0 if cuda else None),
        Metric(f"overlap_cut_tokens[{key}]", row["cut"], "", "> 0", row["cut"] > 0),
        Metric(f"overlap_rel_diff[{key}]", float(f"{rel:.3g}"), "", f"< {REL_DIFF}",
               rel < REL_DIFF),
        Metric(f"overlap_tokens_equal[{key}]", int(row["tokens_equal"]), "", "1",
               row["tokens_equal"])]


def _stream_metrics(key: str, timeline: list[dict]) -> list[Metric]:
    """Per source (graph replay, eager): the streams that ran kernels, the time two ran at once."""
    out = []
    for source in ("graph", "eager"):
        rows = [r for r in timeline if r["source"] == source]
        if rows:
            both = round(concurrent_ms(rows), 3)
            out += [Metric(f"overlap_streams[{key},{source}]", len(streams_busy_ms(rows))),
                    Metric(f"overlap_concurrent_ms[{key},{source}]", both, "ms")]
    return out
