"""What ``measure sim_vs_gpu`` reports: errors per run kind, cost model and iteration kind (a
measured stall left out and counted), the serving runs' latency errors, and their figure."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sarathi_lab.engine.metrics import STALL
from sarathi_lab.measure.bench.task_tables import CHUNKS_SUMMED, END_TO_END, ONE_LAYER_ATTENTION
from sarathi_lab.measure.sim_check import parity
from sarathi_lab.measure.sim_check.point_table import (
    COST_MODEL,
    KIND,
    MEASURED,
    PREDICTED,
    rel_err,
    summary,
)

ITERATION_KINDS = ("decode", "prefill", "hybrid")
OTHER_KINDS = (CHUNKS_SUMMED, ONE_LAYER_ATTENTION, END_TO_END)
ALL_RUNS = "all"
# The papers' P99 TBT is itl_p99_s.
SERVING_ERRORS = ("makespan_s", "itl_p99_s", "ttft_p50_s")
COLOURS = {"roofline": "tab:orange", "profile": "tab:blue", "calibrated": "tab:green"}
MARKERS = {"decode": "o", "prefill": "s", "hybrid": "^"}


def _stats(group: pd.DataFrame) -> dict:
    kept = group[~group.stall]
    err = summary(rel_err(kept[PREDICTED], kept[MEASURED]))
    # a job's name is unique within its sweep only
    runs = len(group[["run_kind", "job"]].drop_duplicates())
    return {"runs": runs, "points": len(kept), "stalls_left_out": int(group.stall.sum()),
            "measured_ms": 1e3 * kept[MEASURED].median(),
            "simulated_ms": 1e3 * kept[PREDICTED].median()} | {
        stat: err[stat] for stat in ("median_rel_err", "median_abs_rel_err", "worst_abs_rel_err")}


def iteration_errors(points: pd.DataFrame, unavailable: pd.DataFrame) -> pd.DataFrame:
    """Iteration kinds, then the tasks' quantities, plus ``ALL_RUNS``; a failed model says why."""
    if len(points):
        order = {k: i for i, k in enumerate((*ITERATION_KINDS, *OTHER_KINDS))}
        groups = [*points.groupby(["run_kind", "cost_model", "kind"], sort=False)]
        pooled = points[points.kind.isin(ITERATION_KINDS)]
        if pooled.run_kind.nunique() > 1:
            groups += [((ALL_RUNS, *key), g)
                       for key, g in pooled.groupby(["cost_model", "kind"], sort=False)]
        table = pd.DataFrame([dict(zip(("run_kind", "cost_model", "kind"), key))
                              | {"status": "compared"} | _stats(g) for key, g in groups])
        table = table.assign(_k=table.kind.map(order), _r=table.run_kind == ALL_RUNS).sort_values(
            ["_r", "run_kind", "cost_model", "_k"], kind="stable").drop(columns=["_k", "_r"])
    else:
        table = pd.DataFrame()
    refused = pd.DataFrame([{"run_kind": r.run_kind, "cost_model": r.cost_model, "kind": "",
                             "status": r.status, "runs": r.runs, "points": 0}
                            for r in unavailable.itertuples()])
    both = pd.concat([table, refused], ignore_index=True)
    counts = [c for c in ("runs", "points", "stalls_left_out") if c in both]
    return both.astype({c: "Int64" for c in counts})


def serving_errors(table: pd.DataFrame) -> pd.DataFrame:
    """Median and worst signed error of each SERVING_ERRORS, and how many runs batched alike."""
    serving = table[table.task == "serve"] if len(table) else table
    rows = []
    for (kind_of_run, model), g in serving.groupby(["run_kind", "cost_model"], sort=False):
        row = {"run_kind": kind_of_run, "cost_model": model, "runs": len(g),
               "identical_batches": int(g.identical_batches.sum())}
        for key in SERVING_ERRORS:
            err = summary(g[f"{key}_rel_err"])
            row |= {f"{key}_median_rel_err": err["median_rel_err"],
                    f"{key}_worst_rel_err": err["worst_rel_err"]}
        rows.append(row)
    return pd.DataFrame(rows)


def _error_panel(ax, errors: pd.DataFrame, models: list[str]) -> None:
    shown = errors[errors.status == "compared"]
    groups = sorted(dict.fromkeys(zip(shown.run_kind, shown.kind)),
                    key=lambda g: (g[1] not in ITERATION_KINDS, g[0] == ALL_RUNS, g[0]))
    width = 0.8 / max(len(models), 1)
    for i, model in enumerate(models):
        rows = shown[shown.cost_model == model].set_index(["run_kind", "kind"])
        x = np.arange(len(groups)) + (i - (len(models) - 1) / 2) * width
        median = [100 * rows.median_abs_rel_err.get(g, np.nan) for g in groups]
        worst = [100 * rows.worst_abs_rel_err.get(g, np.nan) for g in groups]
        ax.bar(x, median, width, color=COLOURS.get(model), label=f"{model}: median")
        ax.scatter(x, worst, s=14, color=COLOURS.get(model), edgecolor="k", linewidth=0.5, zorder=3,
                   label=f"{model}: worst")
    ax.axhline(10, color="k", lw=0.8, ls="--", label="10%")
    iterations = sum(kind in ITERATION_KINDS for _, kind in groups)
    if iterations < len(groups):
        ax.axvline(iterations - 0.5, color="0.5", lw=0.8)
    ax.set_xticks(range(len(groups)), [f"{run}: {kind}" for run, kind in groups], rotation=35,
                  ha="right", fontsize=7)
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set(yscale="log", ylabel="|simulated / measured - 1| (%)",
           title="per run kind and iteration kind (right of the line: sums and parts of "
                 "iterations)")
    values = 100 * shown[["median_abs_rel_err", "worst_abs_rel_err"]].to_numpy().ravel()
    values = values[np.isfinite(values) & (values > 0)]
    if len(values):  # room for the legend
        ax.set_ylim(min(values.min(), 10) / 2, max(values.max(), 10) * 8)
    ax.legend(fontsize=7, ncol=len(models) + 1, loc="upper left")


def _parity_panel(ax, points: pd.DataFrame) -> None:
    parity.draw(ax, points[points.kind.isin(ITERATION_KINDS)], "every compared iteration",
                colour_by=COST_MODEL, colours=COLOURS, marker_by=KIND, markers=MARKERS,
                flagged="stall", flag_label=f"measured stall (> {STALL:g}x its kind's median)")


def _serving_panel(ax, table: pd.DataFrame, models: list[str]) -> None:
    serving = table[table.task == "serve"]
    for i, model in enumerate(models):
        rows = serving[serving.cost_model == model]
        for j, key in enumerate(SERVING_ERRORS):
            x = j + (i - (len(models) - 1) / 2) * 0.3 + np.linspace(-0.08, 0.08, len(rows))
            ax.scatter(x, 100 * rows[f"{key}_rel_err"], s=10, color=COLOURS.get(model), label=model
                       if j == 0 else None)
    ax.axhline(0, color="k", lw=0.8)
    ax.axhspan(-15, 15, color="0.9", zorder=-1, label="within 15%")
    names = {"makespan_s": "makespan", "itl_p99_s": "P99 TBT", "ttft_p50_s": "median TTFT"}
    ax.set_xticks(range(len(SERVING_ERRORS)), [names[k] for k in SERVING_ERRORS])
    ax.set(ylabel="simulated / measured - 1 (%)", title=f"serving runs ({serving.job.nunique()})")
    ax.legend(fontsize=7)


def _gain_panel(ax, gain: pd.DataFrame, models: list[str]) -> None:
    for chunk, group in gain.groupby("chunk"):
        style = "-" if chunk == gain.chunk.min() else "--"
        group = group.sort_values("pd_ratio")
        ax.plot(group.pd_ratio, group.measured, style, color="k", marker="o",
                label=f"measured, chunk {chunk:g}")
        for model in (m for m in models if m in group):
            ax.plot(group.pd_ratio, group[model], style, color=COLOURS.get(model), marker="s", ms=4,
                    label=f"{model}, chunk {chunk:g}")
    ax.axhline(1, color="0.5", lw=0.8)
    ratios = sorted(gain.pd_ratio.unique())
    ax.set(xscale="log", xlabel="P:D (prompt / decode tokens)",
           ylabel="sarathi throughput / static's (x)", title="pd_ratio: gain over the baseline")
    ax.set_xticks(ratios, [f"{r:g}" for r in ratios])
    ax.minorticks_off()
    ax.legend(fontsize=7)


def figure(points: pd.DataFrame, errors: pd.DataFrame, table: pd.DataFrame,
           gain: pd.DataFrame | None, title: str, path: Path) -> None:
    from matplotlib.figure import Figure  # no pyplot: no GUI backend

    models = [m for m in dict.fromkeys(points.cost_model)]
    lower = ["parity"] + (["serving"] if (table.task == "serve").any() else []) + (
        ["gain"] if gain is not None and len(gain) else [])
    fig = Figure(figsize=(max(12, 5 * len(lower)), 10))
    axes = fig.subplot_mosaic([["errors"] * len(lower), lower], height_ratios=[1, 1.05])
    _error_panel(axes["errors"], errors, models)
    _parity_panel(axes["parity"], points)
    if "serving" in axes:
        _serving_panel(axes["serving"], table, models)
    if "gain" in axes:
        _gain_panel(axes["gain"], gain, models)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=90)
