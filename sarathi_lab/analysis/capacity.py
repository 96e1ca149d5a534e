"""Sarathi-Serve's capacity results: searches' table, capacity bars, TTFT-vs-TBT, claims rows."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from sarathi_lab.analysis import paper
from sarathi_lab.analysis.claims import COLUMNS, NO_REPEATS, VERSUS
from sarathi_lab.analysis.figures import legend_outside, plain_log_ticks
from sarathi_lab.analysis.verdict import BOUND, Judged, judge
from sarathi_lab.engine.scheduler import scheduler_names
from sarathi_lab.executors import recorded_as
from sarathi_lab.harness.results import (
    CAPACITY_JSON,
    METRICS,
    current_names,
    is_finished,
    read_record,
)
from sarathi_lab.sim.cost_model import ANALYTIC

log = logging.getLogger(__name__)

# The hybrid-batching claim: orca's P99 TBT at least this many times stall-free batching's.
HYBRID_TBT_MIN_RATIO = 2
# The pair the capacity gain compares, first in tables; the others follow in registry order.
COMPARED = ("sarathi_serve", "vllm")
TABLE_COLUMNS = ["scheduler", "tbt_slo_s", "sched_delay_slo_s", "capacity_rps", "resolution",
                 "binding", "bounded",
                 "num_trials", "token_budget", "at_capacity_itl_p99_s", "at_capacity_ttft_p50_s",
                 "at_capacity_sched_delay_p50_s", "executor", "model", "scale"]
# What a measured capacity depends on besides the model.
MEASURED_COLUMNS = ["dtype", "device_name", "torch_threads", "timing_unreliable"]
# What a simulated capacity depends on besides the model.
SIMULATED_COLUMNS = ["sim_device", "sim_cost_model", "sim_tp"]
# A replayed trace's recorded rate, and the capacity as a multiple of it.
TRACE_COLUMNS = ["trace_rate_rps", "capacity_rate_scale"]
# The code's commit a search ran (its environment's); tables written before it lack the column.
COMMIT_COLUMN = "git_commit"


def load_searches(root: str | Path) -> pd.DataFrame:
    """One row per finished capacity search under root."""
    rows = []
    for path in sorted(Path(root).rglob(CAPACITY_JSON)):
        if not is_finished(path.parent):
            # capacity.json written but not metrics.json (written last)
            continue
        try:
            rows.append(_search_row(path))
        except (OSError, ValueError, KeyError, TypeError) as e:
            what = f"lacks {e}" if isinstance(e, KeyError) else str(e) or type(e).__name__
            log.warning("%s (or its metrics.json) is unreadable (%s); left out", path, what)
    return pd.DataFrame(rows)


def _search_row(path: Path) -> dict:
    # A search from before its rates' names carried their unit reads as today's.
    found = current_names(json.loads(path.read_text()))
    record = read_record(path.parent / METRICS)
    summary = current_names(record["summary"])
    return (record["config"] | {"run_dir": str(path.parent), "tbt_slo_s": found["slo"]["tbt_p99_s"],
                                "sched_delay_slo_s": found["slo"]["sched_delay_p50_s"]}
            | {key: found[key] for key in ("capacity_rps", "resolution", "binding", "bounded")}
            | {"num_trials": len(found["trials"])}
            | {key: summary.get(key) for key in ("token_budget", "at_capacity_itl_p99_s",
                                                 "at_capacity_ttft_p50_s",
                                                 "at_capacity_sched_delay_p50_s", *TRACE_COLUMNS)}
            | {key: record["environment"].get(key)
               for key in ("device_name", "torch_threads", "timing_unreliable",
                           *SIMULATED_COLUMNS, COMMIT_COLUMN)})


def compact(searches: pd.DataFrame) -> pd.DataFrame:
    """The committed table of searches (docs/capacity/*_capacity.csv), with what produced them."""
    simulated = searches.executor.map(lambda name: recorded_as(name, "simulated")).astype(bool)
    replayed = "trace_rate_rps" in searches and searches.trace_rate_rps.notna().any()
    committed = COMMIT_COLUMN in searches and searches[COMMIT_COLUMN].notna().any()
    columns = (TABLE_COLUMNS + TRACE_COLUMNS * bool(replayed)
               + MEASURED_COLUMNS * bool((~simulated).any())
               + SIMULATED_COLUMNS * bool(simulated.any()) + [COMMIT_COLUMN] * bool(committed))
    return searches[columns].sort_values(["tbt_slo_s", "scheduler",
                                          "token_budget"]).reset_index(drop=True)


def csv_text(table: pd.DataFrame) -> str:
    """Six significant digits: read by people and diffs, not re-analysed."""
    return table.to_csv(index=False, float_format="%g")


def write_csv(table: pd.DataFrame, path: str | Path) -> Path:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(csv_text(table))
    return Path(path)


def capacity_table(searches: pd.DataFrame) -> pd.DataFrame:
    """Capacity (req/s) per scheduler and TBT SLO, with sarathi_serve / vllm."""
    # dropna=False: a scheduler that failed its lowest rate everywhere is a result, not a gap.
    table = searches.pivot_table(index="scheduler", columns="tbt_slo_s", values="capacity_rps",
                                 aggfunc="max", dropna=False)
    order = [*COMPARED, *(s for s in scheduler_names() if s not in COMPARED)]
    table = table.reindex([s for s in order if s in table.index])
    if {"sarathi_serve", "vllm"} <= set(table.index):
        table.loc["sarathi_serve / vllm"] = table.loc["sarathi_serve"] / table.loc["vllm"]
    return table


def plot_capacity(searches: pd.DataFrame, ax, title: str):
    """Capacity bars per scheduler, a group per SLO; the paper's gain over vLLM beside ours."""
    table = capacity_table(searches)
    gains = table.loc["sarathi_serve / vllm"] if "sarathi_serve / vllm" in table.index else None
    table = table.drop(index="sarathi_serve / vllm", errors="ignore")
    slos = list(table.columns)
    width = 0.8 / len(table.index)
    x = np.arange(len(slos))
    for i, scheduler in enumerate(table.index):
        ax.bar(x + i * width, table.loc[scheduler].to_numpy(float), width, label=scheduler)
    ours = [f"{gains[slo]:.2f}x" if gains is not None and np.isfinite(gains[slo]) else "n/a"
            for slo in slos]
    # The paper's gain is its strict SLO's: only the strictest SLO searched stands beside it.
    labels = [f"P99 TBT <= {slo:g} s\nsarathi_serve/vllm: ours {o}\n"
              + (f"paper {paper.CAPACITY_GAIN_OVER_VLLM}x (its strict SLO)" if slo == min(slos)
                 else "paper: no number at a relaxed SLO") for slo, o in zip(slos, ours)]
    ax.set_xticks(x + width * (len(table.index) - 1) / 2, labels, fontsize=8)
    ax.set(ylabel="capacity (requests/s)", title=title)
    ax.legend(fontsize=8)


def _bounded(searches: pd.DataFrame) -> bool:
    """Every search found a failing rate; an unbounded one's capacity is only a lower bound."""
    return "bounded" not in searches or bool(searches.bounded.all())


def scale_label(rows: pd.DataFrame) -> str:
    return f"{rows.model.iloc[0]}, scale {rows.scale.iloc[0]}"


def capacity_figure(simulated: pd.DataFrame, measured: pd.DataFrame | None, source: str):
    """Two panels: simulated capacities (``source``) and CPU-measured ones (or a note)."""
    fig, (sim_ax, cpu_ax) = plt.subplots(1, 2, figsize=(14, 4.8), layout="constrained")
    plot_capacity(simulated, sim_ax, f"{source}: scale {simulated.scale.iloc[0]}")
    measured, left_out = reliable(measured)
    if measured is not None and len(measured):
        caveats = [text for flag, text in ((left_out != "none", left_out),
                                           (not _bounded(measured),
                                            "some searches passed every rate: capacity >= bar"))
                   if flag]
        first = measured.iloc[0]
        label = (f"measured CPU ({first.device_name}): {scale_label(measured)}, {first['dtype']}, "
                 f"{first.torch_threads:g} thread(s)")
        plot_capacity(measured, cpu_ax, label + "".join(f"\n({c})" for c in caveats))
    else:
        why = f"every search left out\n({left_out})" if left_out != "none" else "not measured yet"
        cpu_ax.text(0.5, 0.5, f"CPU capacity: {why}\n(experiment=capacity; "
                              "docs/capacity/README.md)",
                    ha="center", va="center", transform=cpu_ax.transAxes)
        cpu_ax.set_axis_off()
    return fig


def plot_tradeoff(tradeoff: pd.DataFrame, ax, title: str):
    """TTFT p50 against P99 TBT: sarathi_serve's budgets a curve, the others points."""
    serve = tradeoff[tradeoff.scheduler == "sarathi_serve"].sort_values("chunk")
    ax.plot(serve.itl_p99_s, serve.ttft_p50_s, "o-",
            label="sarathi_serve, labelled by token budget")
    # Labels alternate above and below the curve: neighbouring budgets lie close.
    for i, (_, row) in enumerate(serve.iterrows()):
        ax.annotate(f"{row.chunk:g}", (row.itl_p99_s, row.ttft_p50_s), fontsize=7, ha="center",
                    xytext=(0, 7 if i % 2 == 0 else -12), textcoords="offset points")
    for scheduler, rows in tradeoff[tradeoff.scheduler != "sarathi_serve"].groupby("scheduler"):
        ax.plot(rows.itl_p99_s, rows.ttft_p50_s, "s", label=scheduler)
    # Log axes: static's TTFT is tens of times the others'.
    ax.set(xscale="log", yscale="log", xlabel="P99 TBT (s)", ylabel="median TTFT (s)", title=title)
    plain_log_ticks(ax.xaxis)
    plain_log_ticks(ax.yaxis)
    legend_outside(ax, fontsize=8)


def chunked_prefill_overhead(cost_model, prompt_len: int, chunk: int) -> float:
    """Chunked over one-iteration prefill time, minus 1; only the last chunk pays an LM-head row."""
    whole = cost_model.iteration_time_s(prefills=[(prompt_len, prompt_len)], num_sampled=1)
    chunked = 0.0
    for start in range(0, prompt_len, chunk):
        end = min(start + chunk, prompt_len)
        chunked += cost_model.iteration_time_s(prefills=[(end - start, end)],
                                               num_sampled=int(end == prompt_len))
    return chunked / whole - 1


@dataclass(frozen=True)
class Evidence:
    """One source's claims inputs (None: absent): searches, trade-off, overhead, provenance;
    ``overhead_model``: the cost model the overhead was computed with."""
    searches: pd.DataFrame | None = None
    tradeoff: pd.DataFrame | None = None
    overhead: dict[int, float] | None = None
    provenance: dict[str, str] | None = None
    overhead_model: str | None = None


@dataclass(frozen=True)
class Found:
    """What a check found: the ours, holds, spread and ours / paper cells."""
    ours: str
    holds: str
    spread: str
    versus: str = ""


def reliable(searches: pd.DataFrame | None) -> tuple[pd.DataFrame | None, str]:
    """The searches not flagged ``timing_unreliable``, and what was left out."""
    if searches is None or "timing_unreliable" not in searches:
        return searches, "none"
    flagged = searches.timing_unreliable.fillna(False).astype(bool)
    left = (f"{flagged.sum()} of {len(searches)} searches left out: timing unreliable"
            if flagged.any() else "none")
    return searches[~flagged], left


def _ratio_interval(s: pd.Series, v: pd.Series) -> tuple[float, float]:
    """sarathi_serve's capacity over vllm's, as low and high as the searches' brackets allow."""
    def bracket(row):
        res = row.get("resolution", 0.0)
        return row.capacity_rps, row.capacity_rps * (1 + res) if pd.notna(res) else np.inf
    (s_lo, s_hi), (v_lo, v_hi) = bracket(s), bracket(v)
    return s_lo / v_hi, s_hi / v_lo


def gain(evidence: Evidence, paper_gain: float = paper.CAPACITY_GAIN_OVER_VLLM) -> Found | None:
    """sarathi_serve's capacity over vllm's at each SLO; the strictest judged against
    ``paper_gain``, the searches' brackets its spread."""
    searches = evidence.searches
    if (searches is None or not len(searches)
            or not {"sarathi_serve", "vllm"} <= set(searches.scheduler)):
        return None
    texts, judged, spreads = [], {}, {}
    for slo, rows in searches.groupby("tbt_slo_s"):
        serve = (rows[rows.scheduler == "sarathi_serve"]
                 .sort_values("capacity_rps", na_position="first"))
        vllm = rows[rows.scheduler == "vllm"].sort_values("capacity_rps", na_position="first")
        if not len(serve) or not len(vllm):
            continue
        # A capacity of None failed even its lowest rate: below any that passed.
        s, v = serve.iloc[-1], vllm.iloc[-1]
        if np.isnan(s.capacity_rps) or np.isnan(v.capacity_rps):
            both = np.isnan(s.capacity_rps) and np.isnan(v.capacity_rps)
            text = ("neither passed a rate tried" if both
                    else (f"{'vllm' if np.isnan(v.capacity_rps) else 'sarathi_serve'} "
                          "passed no rate tried"))
            judged[slo] = (Judged("n/a", why=text) if both
                           else Judged("unclear", why=f"{text}: a direction, no ratio")
                           if np.isnan(v.capacity_rps) else Judged("no", why=text))
            spreads[slo] = ""
        else:
            low, high = _ratio_interval(s, v)
            judged[slo] = judge(s.capacity_rps / v.capacity_rps, paper_gain, (low, high))
            text = f"{s.capacity_rps / v.capacity_rps:.2f}x"
            spreads[slo] = f"{low:.2f}x to {high:.2f}x at P99 TBT <= {slo:g} s (search brackets)"
        texts.append(f"{text} at P99 TBT <= {slo:g} s")
    if not judged:
        return None
    slo, ours = min(judged), ", ".join(texts)
    pair = searches[(searches.tbt_slo_s == slo)
                    & searches.scheduler.isin(["sarathi_serve", "vllm"])]
    if not _bounded(pair):
        return Found(f"{ours} ({scale_label(searches)}; a strict search passed every rate tried: "
                     "no ratio)", "n/a", "")
    return Found(f"{ours} ({scale_label(searches)})", judged[slo].word, spreads[slo],
                 f"P99 TBT <= {slo:g} s: {judged[slo].text()}")


def _hybrid_tbt(evidence: Evidence) -> Found | None:
    tradeoff = evidence.tradeoff
    if tradeoff is None or not {"orca", "sarathi_serve"} <= set(tradeoff.scheduler):
        return None
    orca = tradeoff[tradeoff.scheduler == "orca"].itl_p99_s.max()
    serve = tradeoff[tradeoff.scheduler == "sarathi_serve"]
    at_512 = serve[serve.chunk == 512].itl_p99_s
    ratio = orca / (at_512.iloc[0] if len(at_512) else serve.itl_p99_s.min())
    judged = judge(ratio, paper.NAIVE_HYBRID_TBT_INFLATION)
    return Found(f"{ratio:.1f}x ({scale_label(tradeoff)})", judged.word, NO_REPEATS,
                 judged.text())


def _overhead(evidence: Evidence) -> Found | None:
    if not evidence.overhead:
        return None
    ours = ", ".join(f"{v:+.1%} at {n}" for n, v in sorted(evidence.overhead.items()))
    spread = "computed from the cost model: no spread"
    if evidence.overhead_model in ANALYTIC:
        # Its kernels run at the device's rates at every size: a chunk costs only its flops and
        # bytes, so chunking adds the KV re-reads and nothing the paper measured on top.
        return Found(f"{ours} tokens", "n/a", spread,
                     f"by construction: the {evidence.overhead_model} cost model charges a chunk "
                     "only its flops and bytes (no per-chunk cost), so it cannot show the "
                     "paper's overhead")
    judged = judge(1 + max(evidence.overhead.values()), 1 + paper.CHUNK512_PREFILL_OVERHEAD,
                   kind=BOUND)
    return Found(f"{ours} tokens", judged.word, spread, f"largest: {judged.text()}")


# (claim, paper, check, what a measured row says without evidence)
CHECKS = (
    ("sarathi_serve's capacity exceeds vllm's under the strict TBT SLO",
     f"{paper.CAPACITY_GAIN_OVER_VLLM}x (Mistral-7B, A100, strict 0.1 s)", gain,
     "not measured yet"),
    ((f"Hybrid batching without a budget (orca) raises P99 TBT {HYBRID_TBT_MIN_RATIO}x or more "
      "over stall-free batching at the same load"),
     f"up to {paper.NAIVE_HYBRID_TBT_INFLATION}x", _hybrid_tbt, "not measured yet"),
    ("Prefilling in 512-token chunks costs at most ~25% more than whole prompts",
     f"at most ~{paper.CHUNK512_PREFILL_OVERHEAD:.0%}", _overhead,
     "not measured here: see the chunk_overhead rows"),
)


def capacity_claims(*sources: Evidence, checks=CHECKS) -> pd.DataFrame:
    """Each check's row on each source's evidence; unreliable searches left out and counted."""
    rows = []
    for evidence in sources:
        searches, left_out = reliable(evidence.searches)
        usable = replace(evidence, searches=searches)
        for claim, paper_text, check, unmeasured in checks:
            found = check(usable)
            source = (evidence.provenance or {}).get("source", "")
            if found is None and not source.startswith("measured"):
                continue
            found = found or Found(unmeasured, "n/a", "")
            rows.append({"experiment": "capacity", "claim": claim, "paper": paper_text,
                         "ours": found.ours, VERSUS: found.versus, "spread": found.spread,
                         "holds": found.holds, "left out": left_out}
                        | (evidence.provenance or {}))
    return pd.DataFrame(rows, columns=COLUMNS)


TP_CLAIM = (("sarathi_serve's capacity exceeds vllm's under the strict TBT SLO, on GPUs joined by "
             "tensor parallelism"),
            f"up to {paper.CAPACITY_TP_GAIN_OVER_VLLM}x (Yi-34B, 2 A100s, strict 0.2 s)",
            partial(gain, paper_gain=paper.CAPACITY_TP_GAIN_OVER_VLLM),
            "not measurable here: one CPU")
TRACE_CLAIM = (("sarathi_serve's capacity exceeds vllm's under the strict TBT SLO, on the "
               "arxiv_summarization trace's lengths"),
               (f"{paper.CAPACITY_GAIN_OVER_VLLM}x on openchat_sharegpt4 (Mistral-7B, A100, strict "
                "0.1 s); not tabulated for arxiv_summarization"), gain, "not measured here")
