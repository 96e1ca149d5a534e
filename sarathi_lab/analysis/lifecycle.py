"""Each request's lifecycle (queued, chunks, decodes, stalls, preemptions) from a run's tables."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

# The columns saying which requests each iteration held.
MEMBERSHIP = ("prefill_request_ids", "prefill_chunk_tokens", "decode_request_ids",
              "preempted_request_ids")
KV_BLOCKS = "num_kv_blocks_used"
NOT_RECORDED = {
    "membership": "which requests each iteration held (prefill chunks, decodes, preemptions): each "
                  "request is drawn as queued, one prefill span and one decode span",
    "kv_blocks": "KV blocks in use",
}


@dataclass(frozen=True)
class Span:
    request_id: int
    name: str
    start_s: float
    end_s: float
    args: dict = field(default_factory=dict)


def missing(iterations: pd.DataFrame) -> list[str]:
    """What of NOT_RECORDED the iterations table lacks."""
    return ([] if set(MEMBERSHIP) <= set(iterations.columns) else ["membership"]) + (
        [] if KV_BLOCKS in iterations.columns else ["kv_blocks"])


def request_spans(iterations: pd.DataFrame, requests: pd.DataFrame) -> list[Span]:
    """Every request's spans in arrival order, each request's in time order."""
    end_of_run = (float((iterations.start_s + iterations.duration_s).max()) if len(iterations)
                  else 0.0)
    if "membership" in missing(iterations):
        return [s for r in _arrival_order(requests) for s in _coarse(r, end_of_run)]
    starts = iterations.start_s.to_numpy(float)
    ends = (iterations.start_s + iterations.duration_s).to_numpy(float)
    # Each request's (row, order in row, kind, tokens): an eviction while composing an iteration
    # precedes a chunk readmitting it there.
    held: dict[int, list[tuple[int, int, str, int]]] = defaultdict(list)
    columns = (iterations[c] for c in MEMBERSHIP)
    for row, (prefills, chunks, decodes, preempted) in enumerate(zip(*columns)):
        for rid in int_list(preempted):
            held[rid].append((row, 0, "preempted", 0))
        for rid, tokens in zip(int_list(prefills), int_list(chunks)):
            held[rid].append((row, 1, "prefill", tokens))
        for rid in int_list(decodes):
            held[rid].append((row, 1, "decode", 1))
    spans = []
    for r in _arrival_order(requests):
        spans += _exact(r, sorted(held.get(int(r.request_id), [])), starts, ends, end_of_run)
    return spans


def _exact(r, events, starts, ends, end_of_run) -> list[Span]:
    rid, spans = int(r.request_id), []
    add = (lambda name, t0, t1, **args: spans.append(Span(rid, name, float(t0), float(t1), args)))
    if not events:
        add("queued", r.arrival_s, max(end_of_run, r.arrival_s), unfinished=True)
        return spans
    add("queued", r.arrival_s, starts[events[0][0]])
    # last row run; row whose scheduling evicted it; open decode run
    last = evicted = decoding = None
    computed, recompute = 0, False

    def close_decode():
        nonlocal decoding
        if decoding is not None:
            first, to, tokens = decoding
            add("decode", starts[first], ends[to], tokens=tokens, iterations=f"{first}-{to}")
            decoding = None

    for row, _, kind, tokens in events:
        if kind == "preempted":
            close_decode()
            if last is not None and row > last + 1:
                add("stalled", ends[last], starts[row])
            evicted, computed, recompute = row, 0, True
            continue
        if evicted is not None:
            add("preempted", starts[evicted], starts[row])
            evicted = None
        elif last is not None and row > last + 1:
            close_decode()
            add("stalled", ends[last], starts[row])
        if kind == "decode":
            if decoding is not None and decoding[1] == row - 1:
                decoding = (decoding[0], row, decoding[2] + 1)
            else:
                close_decode()
                decoding = (row, row, 1)
        else:
            close_decode()
            add("prefill", starts[row], ends[row], tokens=tokens, first_token_index=computed,
                iteration=row, recompute=recompute)
            computed += tokens
        last = row
    close_decode()
    if evicted is not None:  # evicted and never taken back: a run stopped early
        add("preempted", starts[evicted], max(end_of_run, starts[evicted]), unfinished=True)
    return spans


def _coarse(r, end_of_run) -> list[Span]:
    """The requests table alone: no chunks, stalls or preemptions."""
    rid, spans = int(r.request_id), []
    # None where the run never reached it; such a span runs to the run's end.
    scheduled, first, finish = (None if (v := getattr(r, c, None)) is None or pd.isna(v)
                                else float(v)
                                for c in ("first_scheduled_s", "first_token_s", "finish_s"))
    spans.append(Span(rid, "queued", float(r.arrival_s),
                      scheduled if scheduled is not None else end_of_run))
    if scheduled is not None:
        spans.append(Span(rid, "prefill", scheduled, first if first is not None else end_of_run,
                          {"chunks": "not recorded"}))
    end = finish if finish is not None else end_of_run
    if first is not None and end > first:
        spans.append(Span(rid, "decode", first, end,
                          {"tokens": int(r.output_tokens) - 1, "iterations": "not recorded"}))
    return spans


def _arrival_order(requests: pd.DataFrame):
    return requests.sort_values(["arrival_s", "request_id"], kind="stable").itertuples(index=False)


def int_list(cell) -> list[int]:
    """A list cell (a tuple in memory, an array from parquet, None if a partial table lacks it)."""
    return [] if cell is None else np.asarray(cell, dtype=np.int64).tolist()
