"""Sarathi-Serve's capacity results: searches (task=capacity) as a table, capacity bars per
scheduler and SLO beside the paper's ratio, the TTFT-vs-TBT trade-off over token budgets, and the
claims rows (same columns as analysis/claims.py), each saying its scale and whether it was
simulated or measured.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from sarathi_lab.analysis.claims import COLUMNS
from sarathi_lab.harness.results import METRICS, load_runs

CAPACITY_JSON = "capacity.json"  # harness/tasks/capacity.py writes it beside the search's metrics.json

# arXiv 2403.02310: capacity gain over vLLM (Mistral-7B, one A100, strict SLO), P99 TBT of hybrid
# batching without a budget over stall-free batching, and the prefill overhead of 512-token chunks.
PAPER_GAIN_OVER_VLLM = 2.6
PAPER_HYBRID_TBT_RATIO = 28.3
PAPER_CHUNK_512_OVERHEAD = 0.25
SCHEDULERS = ("sarathi_serve", "vllm", "orca", "static")


def load_searches(root: str | Path) -> pd.DataFrame:
    """One row per capacity search under root: its key config, SLO, token budget and result."""
    rows = []
    for path in sorted(Path(root).rglob(CAPACITY_JSON)):
        found = json.loads(path.read_text())
        record = json.loads((path.parent / METRICS).read_text())
        summary = record["summary"]
        rows.append(record["config"] | {
            "run_dir": str(path.parent), "tbt_slo_s": found["slo"]["tbt_p99_s"],
            "sched_delay_slo_s": found["slo"]["sched_delay_p50_s"], "capacity_qps": found["capacity_qps"],
            "resolution": found["resolution"], "binding": found["binding"], "bounded": found["bounded"],
            "num_trials": len(found["trials"]), "token_budget": summary.get("token_budget"),
            "at_capacity_tbt_p99": summary.get("at_capacity_tbt_p99"),
            "at_capacity_ttft_p50": summary.get("at_capacity_ttft_p50"),
            "at_capacity_sched_delay_p50_s": summary.get("at_capacity_sched_delay_p50_s")})
    return pd.DataFrame(rows)


def capacity_table(searches: pd.DataFrame) -> pd.DataFrame:
    """Capacity (req/s) per scheduler (rows) and TBT SLO (columns), with sarathi_serve / vllm."""
    table = searches.pivot_table(index="scheduler", columns="tbt_slo_s", values="capacity_qps", aggfunc="max")
    table = table.reindex([s for s in SCHEDULERS if s in table.index])
    if {"sarathi_serve", "vllm"} <= set(table.index):
        table.loc["sarathi_serve / vllm"] = table.loc["sarathi_serve"] / table.loc["vllm"]
    return table


def plot_capacity(searches: pd.DataFrame, ax, title: str = ""):
    """Bars: capacity per scheduler, one group per SLO; the paper's gain over vLLM beside ours."""
    table = capacity_table(searches)
    gains = table.loc["sarathi_serve / vllm"] if "sarathi_serve / vllm" in table.index else None
    table = table.drop(index="sarathi_serve / vllm", errors="ignore")
    slos = list(table.columns)
    width = 0.8 / len(table.index)
    x = np.arange(len(slos))
    for i, scheduler in enumerate(table.index):
        ax.bar(x + i * width, table.loc[scheduler].to_numpy(float), width, label=scheduler)
    labels = []
    for slo in slos:
        ours = f"{gains[slo]:.2f}x" if gains is not None and np.isfinite(gains[slo]) else "n/a"
        labels.append(f"P99 TBT <= {slo:g} s\nsarathi_serve/vllm: ours {ours}, paper {PAPER_GAIN_OVER_VLLM}x (strict)")
    ax.set_xticks(x + width * (len(table.index) - 1) / 2, labels, fontsize=8)
    ax.set_ylabel("capacity (requests/s)")
    ax.set_title(title or "capacity under a P99 TBT SLO and median scheduling delay <= 2 s")
    ax.legend(fontsize=8)
    return ax


def load_tradeoff(root: str | Path) -> pd.DataFrame:
    """Serving runs of a budget sweep (and the other schedulers at the same load): TTFT p50 and
    P99 TBT per scheduler and token budget (chunk)."""
    runs = load_runs(root)
    keep = ["scheduler", "chunk", "executor", "model", "scale", "ttft_p50", "tbt_p99", "sched_delay_p50_s",
            "request_throughput_rps", "saturated"]
    return runs[[c for c in keep if c in runs]].sort_values(["scheduler", "chunk"]).reset_index(drop=True)


def plot_tradeoff(tradeoff: pd.DataFrame, ax, title: str = ""):
    """TTFT p50 against P99 TBT: sarathi_serve's budgets as a curve, the other schedulers as points."""
    serve = tradeoff[tradeoff.scheduler == "sarathi_serve"].sort_values("chunk")
    ax.plot(serve.tbt_p99, serve.ttft_p50, "o-", label="sarathi_serve (token budget)")
    for _, row in serve.iterrows():
        ax.annotate(f"{row.chunk:g}", (row.tbt_p99, row.ttft_p50), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")
    for scheduler, rows in tradeoff[tradeoff.scheduler != "sarathi_serve"].groupby("scheduler"):
        ax.plot(rows.tbt_p99, rows.ttft_p50, "s", label=scheduler)
    ax.set_xscale("log")
    ax.set_xlabel("P99 TBT (s)")
    ax.set_ylabel("median TTFT (s)")
    ax.set_title(title or "TTFT vs TBT over sarathi_serve's token budget, same load")
    ax.legend(fontsize=8)
    return ax


def chunked_prefill_overhead(cost_model, prompt_len: int, chunk: int) -> float:
    """Time of a prompt prefilled in chunks over its time in one iteration, minus 1 (no decodes)."""
    whole = cost_model.iteration_time_s(prefills=[(prompt_len, prompt_len)])
    chunked = sum(cost_model.iteration_time_s(prefills=[(min(chunk, prompt_len - start), min(start + chunk, prompt_len))])
                  for start in range(0, prompt_len, chunk))
    return chunked / whole - 1


def _source(rows: pd.DataFrame) -> str:
    first = rows.iloc[0]
    kind = "simulated" if first.executor == "sim" else "measured"
    return f"{kind}, {first.model}, scale {first.scale}"


def _row(claim: str, paper_text: str, ours: str, holds: str) -> dict:
    return dict(zip(COLUMNS, ("capacity", claim, paper_text, ours, holds)))


def capacity_claims(searches: pd.DataFrame | None = None, tradeoff: pd.DataFrame | None = None,
                    overhead: dict[int, float] | None = None, overhead_source: str = "") -> pd.DataFrame:
    """The Sarathi-Serve rows of the claims table. ``searches``: load_searches; ``tradeoff``:
    load_tradeoff (orca and sarathi_serve at one load); ``overhead``: {prompt length: overhead of
    512-token chunks}, e.g. from chunked_prefill_overhead, with what predicted or measured it."""
    rows = []
    if searches is not None and len(searches):
        table = capacity_table(searches)
        if "sarathi_serve / vllm" in table.index:
            gains = table.loc["sarathi_serve / vllm"]
            strict = gains.index.min()
            ours = ", ".join(f"{g:.2f}x at P99 TBT <= {slo:g} s" for slo, g in gains.items())
            rows.append(_row("sarathi_serve's capacity exceeds vllm's under the strict TBT SLO",
                             f"{PAPER_GAIN_OVER_VLLM}x (Mistral-7B, A100, strict 0.1 s)",
                             f"{ours} ({_source(searches)})",
                             "yes" if gains[strict] > 1 else "no" if np.isfinite(gains[strict]) else "n/a"))
    if tradeoff is not None and {"orca", "sarathi_serve"} <= set(tradeoff.scheduler):
        orca = tradeoff[tradeoff.scheduler == "orca"].tbt_p99.max()
        serve = tradeoff[tradeoff.scheduler == "sarathi_serve"]
        at_512 = serve[serve.chunk == 512].tbt_p99
        ref = at_512.iloc[0] if len(at_512) else serve.tbt_p99.min()
        ratio = orca / ref
        rows.append(_row("Hybrid batching without a budget (orca) raises P99 TBT many-fold over stall-free "
                         "batching at the same load",
                         f"up to {PAPER_HYBRID_TBT_RATIO}x", f"{ratio:.1f}x ({_source(tradeoff)})",
                         "yes" if ratio >= 2 else "no"))
    if overhead:
        worst = max(overhead.values())
        ours = ", ".join(f"{v:+.1%} at {n}" for n, v in sorted(overhead.items()))
        rows.append(_row("Prefilling in 512-token chunks costs at most ~25% more than whole prompts",
                         f"at most ~{PAPER_CHUNK_512_OVERHEAD:.0%}", f"{ours} tokens ({overhead_source})",
                         "yes" if worst <= PAPER_CHUNK_512_OVERHEAD else "no"))
    return pd.DataFrame(rows, columns=COLUMNS)
