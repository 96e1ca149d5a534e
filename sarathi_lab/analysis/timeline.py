"""A run's batches as a Chrome / Perfetto trace (the Trace Event Format's JSON object), from its
results contract alone, as vidur exports its simulated timeline:

    python -m sarathi_lab.measure timeline RUN_DIR [--out FILE] [--start-s S --duration-s D]

Open it in https://ui.perfetto.dev or chrome://tracing: process ``engine`` holds the iterations and
counters of tokens and KV blocks, process ``requests`` a track per request. Microseconds on the
run's clock (``otherData`` says which). Also written by ``export.timeline=true``."""
from __future__ import annotations

import gzip
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sarathi_lab import cli_args
from sarathi_lab.analysis.lifecycle import (
    KV_BLOCKS,
    MEMBERSHIP,
    NOT_RECORDED,
    int_list,
    missing,
    request_spans,
)
from sarathi_lab.engine.metrics import iteration_kinds
from sarathi_lab.harness.results import (
    METRICS,
    WANDB_DIR,
    UnreadableRun,
    read_record,
    run_source,
    write_atomically,
)

log = logging.getLogger(__name__)
TRACE = "timeline.json"
ENGINE_PID, REQUESTS_PID = 1, 2
US = 1e6


def _us(t0: float, t1: float) -> tuple[float, float]:
    """Microseconds to the nanosecond: events that meet on the run's clock still meet."""
    ts = round(t0 * US, 3)
    return ts, round(t1 * US, 3) - ts


@dataclass(frozen=True)
class RunTables:
    run_dir: Path
    iterations: pd.DataFrame
    requests: pd.DataFrame
    record: dict[str, Any]
    partial: bool

    @property
    def source(self) -> str:
        env = self.record["environment"]
        return run_source(env, env.get("device"))

    @property
    def clock(self) -> str:
        return "virtual" if self.record["environment"].get("simulated") else "wall"

    @property
    def missing(self) -> list[str]:
        return missing(self.iterations)

    def describe(self) -> str:
        """'sarathi, tiny, chunk 64, batch 4: measured CPU, wall clock' and what the run says."""
        config, env = self.record["config"], self.record["environment"]
        notes = (["partial"] * self.partial
                 + ["timing unreliable"] * bool(env.get("timing_unreliable")))
        return (f"{config.get('scheduler')}, {config.get('model')}, chunk {config.get('chunk')}, "
                f"batch {config.get('batch_size')}: {self.source}, {self.clock} clock"
                + "".join(f"; {n}" for n in notes))


# Columns a trace reads (membership is optional: a run lacking it says so).
REQUIRED_COLUMNS = {
    "iterations": ("iteration", "start_s", "duration_s", "num_prefill_tokens", "num_decode_tokens",
                   "num_prefill_requests", "num_decode_requests"),
    "requests": ("request_id", "prompt_tokens", "output_tokens", "arrival_s"),
}


def load_run(run_dir: str | Path) -> RunTables:
    """A finished run's tables (or an interrupted one's ``*.partial.*``); UnreadableRun if none."""
    run_dir = Path(run_dir)
    partial = not (run_dir / METRICS).is_file() and (run_dir / "metrics.partial.json").is_file()
    suffix = ".partial" if partial else ""
    record = read_record(run_dir / f"metrics{suffix}.json")
    tables = {}
    for name in ("iterations", "requests"):
        path = run_dir / f"{name}{suffix}.parquet"
        if not path.is_file():
            raise UnreadableRun(f"{path} is missing: {run_dir} is no serving run (a measurement "
                                "task's tables hold no iterations to draw)")
        try:
            tables[name] = pd.read_parquet(path)
        except (OSError, ValueError) as e:
            raise UnreadableRun(f"{path} is unreadable "
                                f"({' '.join(str(e).split())[:200]})") from None
    for name, needed in REQUIRED_COLUMNS.items():
        if lacking := [c for c in needed if c not in tables[name]]:
            raise UnreadableRun(f"{run_dir / (name + suffix + '.parquet')} lacks column "
                                f"{lacking[0]} (needed: {', '.join(needed)}): a table of another "
                                "version, or edited")
    if lacking := [k for k in ("config", "summary", "environment")
                   if not isinstance(record.get(k), dict)]:
        raise UnreadableRun(f"{run_dir / f'metrics{suffix}.json'} lacks its {lacking[0]} record")
    iterations = tables["iterations"]
    if len(iterations):
        iterations = iterations.sort_values("iteration").reset_index(drop=True)
    return RunTables(run_dir, iterations, tables["requests"], record, partial)


def trace(run: RunTables, start_s: float | None = None,
          duration_s: float | None = None) -> dict[str, Any]:
    """Every event of ``run``, or those overlapping [start_s, start_s + duration_s]."""
    lo = -np.inf if start_s is None else start_s
    hi = np.inf if duration_s is None else lo + duration_s if start_s is not None else duration_s
    keep = (lambda t0, t1: t1 >= lo and t0 <= hi)
    events = [*_names(run), *_iteration_events(run, keep), *_counters(run, lo, hi)]
    events += [{"ph": "X", "pid": REQUESTS_PID, "tid": s.request_id, "name": s.name,
                "cat": "request", "ts": ts, "dur": dur, "args": s.args}
               for s in request_spans(run.iterations, run.requests) if keep(s.start_s, s.end_s)
               for ts, dur in [_us(s.start_s, s.end_s)]]
    config, summary = run.record["config"], run.record["summary"]
    block_size = (run.record["resolved_config"].get("engine") or {}).get("block_size")
    capacity = summary.get("kv_capacity_tokens")
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {
        "run_dir": str(run.run_dir), "source": run.source,
        "clock": f"{run.clock}: seconds since the run's start, as the results tables hold them",
        "time_unit": "us", "scheduler": config.get("scheduler"), "model": config.get("model"),
        "chunk": config.get("chunk"), "batch_size": config.get("batch_size"),
        "experiment": config.get("experiment"), "partial": run.partial,
        "timing_unreliable": bool(run.record["environment"].get("timing_unreliable")),
        "kv_capacity_blocks": capacity // block_size if capacity and block_size else None,
        "git_commit": run.record["environment"].get("git_commit"),
        "window_s": (None if start_s is None and duration_s is None
                     else [lo if start_s is not None else 0.0, hi]),
        "not_recorded": [NOT_RECORDED[m] for m in run.missing]}}


def _names(run: RunTables) -> list[dict]:
    meta = (lambda pid, name, args, tid=None: {"ph": "M", "pid": pid, "name": name, "args": args}
            | ({} if tid is None else {"tid": tid}))
    return [meta(ENGINE_PID, "process_name", {"name": f"engine: {run.source}, {run.clock} clock"}),
            meta(ENGINE_PID, "process_sort_index", {"sort_index": 0}),
            meta(REQUESTS_PID, "process_name", {"name": "requests"}),
            meta(REQUESTS_PID, "process_sort_index", {"sort_index": 1}),
            *(meta(REQUESTS_PID, "thread_name",
                   {"name": f"request {int(r.request_id)} ({int(r.prompt_tokens)} prompt + "
                            f"{int(r.output_tokens)} output tokens)"},
                   int(r.request_id)) for r in run.requests.itertuples(index=False)),
            *(meta(REQUESTS_PID, "thread_sort_index", {"sort_index": k}, int(rid))
              for k, rid in enumerate(
                  run.requests.sort_values(["arrival_s", "request_id"]).request_id))]


def iteration_lanes(starts, ends) -> list[int]:
    """A track per iteration, none overlapping: one unless a pipeline's micro-batches overlap."""
    lane_ends: list[float] = []
    lanes = []
    for t0, t1 in zip(starts, ends):
        free = next((k for k, end in enumerate(lane_ends) if end <= t0 + 1e-12), len(lane_ends))
        lane_ends[free:free + 1] = [t1]
        lanes.append(free)
    return lanes


def _iteration_events(run: RunTables, keep) -> list[dict]:
    its = run.iterations
    if not len(its):
        return []
    starts, durations = its.start_s.to_numpy(float), its.duration_s.to_numpy(float)
    lanes = iteration_lanes(starts, starts + durations)
    kinds = iteration_kinds(its.num_prefill_tokens, its.num_decode_tokens)
    rows = its[[c for c in its.columns if c not in MEMBERSHIP]].to_dict("records")
    members = (_members(its) if "membership" not in run.missing else [{}] * len(its))
    events = [{"ph": "M", "pid": ENGINE_PID, "tid": lane + 1, "name": "thread_name",
               "args": {"name": "iterations" + (f" ({lane + 1})" if lane else "")}}
              for lane in sorted(set(lanes))]
    for row, held, lane, kind, t0, dur in zip(rows, members, lanes, kinds, starts, durations):
        if keep(t0, t0 + dur):
            requests = int(row["num_prefill_requests"] + row["num_decode_requests"])
            args = {k: _plain(v) for k, v in row.items()} | {"num_requests": requests} | held
            ts, us = _us(t0, t0 + dur)
            events.append({"ph": "X", "pid": ENGINE_PID, "tid": lane + 1, "name": str(kind),
                           "cat": "iteration", "ts": ts, "dur": us, "args": args})
    return events


def _members(its: pd.DataFrame) -> list[dict[str, Any]]:
    """Each iteration's requests as event args: prefill chunks {request id: tokens}, decodes."""
    return [{"prefill_chunks": {str(r): n for r, n in zip(int_list(ids), int_list(tokens))},
             "decode_request_ids": int_list(decodes), "preempted_request_ids": int_list(preempted)}
            for ids, tokens, decodes, preempted in zip(*(its[c] for c in MEMBERSHIP))]


def _counters(run: RunTables, lo: float, hi: float) -> list[dict]:
    """Counter samples at each iteration's start, back to zero at its end unless one follows."""
    its = run.iterations
    if not len(its):
        return []
    starts = its.start_s.to_numpy(float)
    ends = starts + its.duration_s.to_numpy(float)
    next_start = np.append(starts[1:], np.inf)
    blocks = its[KV_BLOCKS].to_numpy() if KV_BLOCKS in its else None
    events = []
    for k, (t0, t1, prefill, decode) in enumerate(zip(starts, ends, its.num_prefill_tokens,
                                                      its.num_decode_tokens)):
        if t1 < lo or t0 > hi:
            continue
        events.append({"ph": "C", "pid": ENGINE_PID, "name": "tokens", "ts": round(t0 * US, 3),
                       "args": {"prefill": int(prefill), "decode": int(decode)}})
        if blocks is not None:
            events.append({"ph": "C", "pid": ENGINE_PID, "name": "KV blocks in use",
                           "ts": round(t0 * US, 3), "args": {"blocks": int(blocks[k])}})
        if next_start[k] > t1:
            events.append({"ph": "C", "pid": ENGINE_PID, "name": "tokens", "ts": round(t1 * US, 3),
                           "args": {"prefill": 0, "decode": 0}})
    return events


def _plain(value: Any) -> Any:
    """As JSON takes it (numpy scalars as numbers, NaN as None)."""
    value = value.item() if isinstance(value, np.generic) else value
    return None if isinstance(value, float) and not np.isfinite(value) else value


def out_problem(out: Path) -> str | None:
    """Why the trace cannot be written at ``out``, or None."""
    if out.is_dir():
        return (f"--out={out} is invalid: it is a directory; allowed: a file path (.json, or "
                ".json.gz gzipped)")
    existing = next((p for p in out.absolute().parents if p.exists() or p.is_symlink()), None)
    if existing is not None and not existing.is_dir():
        return f"--out={out} is invalid: it lies under {existing}, which is a file, not a directory"
    return None


def write_trace(payload: dict[str, Any], out: Path) -> Path:
    """Gzipped for a .gz name; whole or not at all."""
    data = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(out, lambda tmp: tmp.write_bytes(gzip.compress(data) if out.suffix == ".gz"
                                                      else data))
    return out


def export_timelines(run_dir: Path) -> list[Path]:
    """``timeline.json`` in every serving run under ``run_dir`` (``export.timeline=true``)."""
    # run_dir itself, or its runs (a capacity search's trials)
    found = sorted(p.parent for p in Path(run_dir).rglob(METRICS)
                   if WANDB_DIR not in p.relative_to(run_dir).parts[:-1])
    written = []
    for run in found:
        if not ((run / "iterations.parquet").is_file() and (run / "requests.parquet").is_file()):
            continue
        try:
            written.append(write_trace(trace(load_run(run)), run / TRACE))
        except UnreadableRun as e:
            log.warning("%s; no timeline written", e)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = cli_args.Parser(prog="python -m sarathi_lab.measure timeline",
                             description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path,
                        help="a run's directory (metrics.json, "
                             "iterations.parquet, requests.parquet)")
    cli_args.shared(parser, out=f"the trace file (default RUN_DIR/{TRACE}; .gz: gzipped)")
    parser.add_argument("--start-s", type=float,
                        help="keep events from this time on the run's clock (s)")
    parser.add_argument("--duration-s", type=float,
                        help="keep events within this long after --start-s (s)")
    args = parser.parse_args(argv)
    for key in ("start_s", "duration_s"):
        value = getattr(args, key)
        if value is not None and not (np.isfinite(value)
                                      and (value > 0 if key == "duration_s" else value >= 0)):
            parser.error(f"--{key.replace('_', '-')}={value} is invalid: must be a finite number "
                         f"{'> 0' if key == 'duration_s' else '>= 0'}")
    if not args.run_dir.is_dir():
        parser.error(f"run_dir {str(args.run_dir)!r} is invalid: no such directory")
    try:
        run = load_run(args.run_dir)
    except UnreadableRun as e:
        parser.error(str(e))
    out = args.out or args.run_dir / TRACE
    if problem := out_problem(out):
        parser.error(problem)
    payload = trace(run, args.start_s, args.duration_s)
    try:
        out = write_trace(payload, out)
    # nothing half-written is left
    except OSError as e:
        cli_args.refuse(f"--out={out} cannot be written: {e.strerror or e} ({e.filename or out}); "
                        "nothing was written; choose another path")
    spans = sum(e["ph"] == "X" and e["pid"] == ENGINE_PID for e in payload["traceEvents"])
    print(f"{out}: {spans} iterations, {len(run.requests)} "
          f"requests ({run.source}, {run.clock} clock)")
    for note in payload["otherData"]["not_recorded"]:
        print(f"not recorded by this run: {note}")
