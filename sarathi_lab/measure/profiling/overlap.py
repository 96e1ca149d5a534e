"""A hybrid iteration run whole and as two nano-batches on two streams (overlap=nano_batch), each
from a CUDA graph of that very batch, timed interleaved, outputs compared; and the nano-batched
forward's kernels per stream with the time two streams ran kernels at once."""
from __future__ import annotations

import json
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

from sarathi_lab.engine.timer import interleaved
from sarathi_lab.measure.profiling.batches import SyntheticBatches
from sarathi_lab.measure.profiling.ops import replayable
from sarathi_lab.model.nano_batch import NO_OVERLAP, OverlapRule

OVERLAP = OverlapRule("nano_batch")


def measure_overlap(llm, chunk: int, decodes: int, context: int,
                    reps: int) -> tuple[dict, list[dict]]:
    """The forward's ms whole and nano-batched (interleaved medians), the outputs' largest
    difference and greedy agreement; the nano-batched kernels per stream (none off CUDA)."""
    runner, clock = llm.engine.executor.runner, llm.engine.clock
    kept = runner.overlap
    batches = SyntheticBatches(llm, seed=0)
    with batches.made([(chunk, context - chunk)], decodes, context) as batch:
        try:
            runner.overlap = NO_OVERLAP
            whole = runner.prepare(batch)
            runner.overlap = OVERLAP
            nano = runner.prepare(batch)
        finally:
            runner.overlap = kept
        calls = {"whole": replayable(runner, whole), "overlap": replayable(runner, nano)}
        outs = {name: call().float().clone() for name, call in calls.items()}
        times = interleaved(calls, reps, clock)
        timeline = []
        if runner.device.type == "cuda":
            eager = lambda: runner.forward(nano)
            for source, call in (("graph", calls["overlap"]), ("eager", eager)):
                timeline += [{"source": source, **row} for row in _timeline(call)]
    a, b = outs["whole"], outs["overlap"]
    row = {"whole_ms": statistics.median(times["whole"][:, 0]) * 1e3,
           "overlap_ms": statistics.median(times["overlap"][:, 0]) * 1e3,
           "cut": nano.nano[0].meta.num_prefill_tokens if nano.nano else 0,
           "rel_diff": float((a - b).abs().max() / a.abs().max().clamp_min(1e-30)),
           "tokens_equal": bool(torch.equal(a.argmax(-1), b.argmax(-1)))}
    return row, timeline


def _timeline(call) -> list[dict]:
    """The kernels of one ``call`` under torch.profiler, from its chrome trace (naming streams)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    return kernel_rows(events)


def kernel_rows(events: list[dict]) -> list[dict]:
    """A trace's kernels by start: stream, name, start (from the first's) and duration in us."""
    kernels = sorted((e for e in events if e.get("cat") == "kernel" and "dur" in e),
                     key=lambda e: e["ts"])
    first = kernels[0]["ts"] if kernels else 0.0
    return [{"stream": int(e.get("args", {}).get("stream", -1)), "name": e.get("name", ""),
             "start_us": round(e["ts"] - first, 3), "dur_us": round(e["dur"], 3)} for e in kernels]


def concurrent_ms(rows: list[dict]) -> float:
    """Milliseconds during which kernels of two or more streams ran at once."""
    edges = sorted([(r["start_us"], 1, r["stream"]) for r in rows] +
                   [(r["start_us"] + r["dur_us"], -1, r["stream"]) for r in rows],
                   key=lambda e: (e[0], e[1]))
    running: dict[int, int] = {}
    both_us, since = 0.0, None
    for t, step, stream in edges:
        if sum(n > 0 for n in running.values()) >= 2 and since is not None:
            both_us += t - since
        running[stream] = running.get(stream, 0) + step
        since = t
    return both_us / 1e3


def streams_busy_ms(rows: list[dict]) -> dict[int, float]:
    """Per stream, in ms."""
    out: dict[int, float] = defaultdict(float)
    for r in rows:
        out[r["stream"]] += r["dur_us"] / 1e3
    return dict(out)
