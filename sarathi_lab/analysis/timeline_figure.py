"""Batch timelines of runs on the same arrivals: iterations as bars over requests' lifecycles."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from sarathi_lab.analysis.lifecycle import NOT_RECORDED, request_spans
from sarathi_lab.analysis.timeline import RunTables, load_run
from sarathi_lab.harness.results import UnreadableRun

COLORS = {"prefill": "#dd8452", "decode": "#4c72b0", "queued": "#d0d0d0", "stalled": "#c44e52",
          "preempted": "#222222"}
# The experiment running every scheduler on the same arrivals, and the two compared.
EXPERIMENT, SCHEDULERS = "scheduler_latency", ("sarathi", "vllm")
FEW_SECONDS = 4.0


def draw(runs: dict[str, RunTables | str | Path], start_s: float = 0.0,
         duration_s: float | None = None):
    """``runs`` ({label: run or directory}) stacked over [start_s, start_s + duration_s]."""
    runs = {label: run if isinstance(run, RunTables) else load_run(run)
            for label, run in runs.items()}
    end = max(float((r.iterations.start_s + r.iterations.duration_s).max()) for r in runs.values()
              if len(r.iterations))
    hi = end if duration_s is None else start_s + duration_s
    fig, axes = plt.subplots(2 * len(runs), 1, sharex=True, figsize=(11, 3.6 * len(runs)),
                             height_ratios=[2, 1.5] * len(runs), squeeze=False)
    for k, (label, run) in enumerate(runs.items()):
        bars, lanes = axes[2 * k, 0], axes[2 * k + 1, 0]
        _iterations(bars, run, start_s, hi)
        described = run.describe()
        bars.set_title(described if described.startswith(f"{label},") else f"{label}: {described}",
                       loc="left", fontsize=9)
        _requests(lanes, run, start_s, hi)
        if run.missing:
            lanes.text(0.99, 0.02, "not recorded: "
                       + "; ".join(NOT_RECORDED[m].split(":")[0] for m in run.missing),
                       transform=lanes.transAxes, ha="right", va="bottom", fontsize=7,
                       style="italic")
    axes[-1, 0].set_xlim(start_s, hi)
    axes[-1, 0].set_xlabel("time on each run's clock (s)")
    handles = [Patch(color=COLORS["prefill"], label="prefill-chunk tokens / prefill"),
               Patch(color=COLORS["decode"], label="decode tokens / decodes"),
               *(Patch(color=COLORS[s], label=s) for s in ("queued", "stalled", "preempted"))]
    fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def _iterations(ax, run: RunTables, lo: float, hi: float) -> None:
    its = run.iterations
    its = its[(its.start_s + its.duration_s >= lo) & (its.start_s <= hi)]
    ax.bar(its.start_s, its.num_prefill_tokens, width=its.duration_s, align="edge",
           color=COLORS["prefill"], linewidth=0)
    ax.bar(its.start_s, its.num_decode_tokens, width=its.duration_s, bottom=its.num_prefill_tokens,
           align="edge", color=COLORS["decode"], linewidth=0)
    ax.set_ylabel("tokens per\niteration", fontsize=8)
    ax.grid(axis="x", visible=False)


def _requests(ax, run: RunTables, lo: float, hi: float) -> None:
    spans = [s for s in request_spans(run.iterations, run.requests) if s.end_s >= lo
             and s.start_s <= hi]
    # by arrival
    order = {rid: k for k, rid in enumerate(dict.fromkeys(s.request_id for s in spans))}
    bars = defaultdict(list)
    for s in spans:
        bars[s.request_id, s.name].append((s.start_s, s.end_s - s.start_s))
    for (rid, state), spans_of in bars.items():
        ax.broken_barh(spans_of, (order[rid] - 0.4, 0.8), facecolors=COLORS[state], linewidth=0)
    ax.set_ylim(len(order) - 0.5, -0.5)  # the first arrival on top
    ax.set_yticks([])
    ax.set_ylabel("requests\n(by arrival)", fontsize=8)
    ax.grid(False)


def scheduler_pair(runs, experiment: str = EXPERIMENT,
                   schedulers=SCHEDULERS) -> dict[str, RunTables] | str:
    """``schedulers``' runs on the same arrivals at the highest rate both have; else why none."""
    try:
        summary = runs.summary(experiment)
    except FileNotFoundError as e:
        return f"No timeline: {e}."
    rows = (summary[summary.scheduler.isin(schedulers)] if "scheduler" in summary
            else summary.iloc[:0])
    keys = [c for c in ("workload.qps", "seed") if c in rows]
    both = [group for _, group in (rows.groupby(keys, dropna=False) if keys else [((), rows)])
            if set(group.scheduler) >= set(schedulers)]
    if not both:
        note = runs.unreliable_note(experiment)
        return ((f"No timeline: {experiment} has no runs of "
                 f"{' and '.join(schedulers)} on the same arrivals")
                + (f" ({note})" if note else "") + ".")
    group = max(both, key=lambda g: (g["workload.qps"].iloc[0] if "workload.qps" in g else 0))
    try:
        return {s: load_run(group[group.scheduler == s].run_dir.iloc[0]) for s in schedulers}
    except UnreadableRun as e:
        return f"No timeline: {e}."


def window(pair: dict[str, RunTables], seconds: float = FEW_SECONDS) -> tuple[float, float]:
    """(start_s, duration_s): ``seconds`` from the first arrival, or to the end of shorter runs."""
    first = min(float(r.requests.arrival_s.min()) for r in pair.values())
    end = max(float((r.iterations.start_s + r.iterations.duration_s).max()) for r in pair.values())
    return first, min(seconds, end - first)
