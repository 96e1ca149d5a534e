"""The quantities the paper plots, from ``load_runs`` frames: pure pandas, testable by hand."""
from __future__ import annotations

import numpy as np
import pandas as pd

from sarathi_lab.analysis import paper
from sarathi_lab.engine.tiles import aligned_chunk

# The paper's baseline: request-level batches, prefill-only then decode-only iterations.
BASELINE = "static"
# What pairs a run with its baseline: the same requests and batch size.
WORKLOAD_KEYS = ("seq_len", "batch_size", "pd_ratio")
# sarathi's chunk alignment as a sweep set it, and as the run recorded it ("auto" settled).
CHUNK_ALIGN = "scheduler.chunk_align"
RECORDED_ALIGN = "chunk_align"


def chunk_align(summary: pd.DataFrame) -> pd.Series:
    """"tile" where the run ran tile-aligned chunks, else "none"; older runs: as swept."""
    index = summary.index
    set_ = summary[CHUNK_ALIGN] if CHUNK_ALIGN in summary else pd.Series("none", index=index)
    recorded = (summary[RECORDED_ALIGN] if RECORDED_ALIGN in summary
                else pd.Series(None, index=index, dtype=object))
    return recorded.fillna(set_.fillna("none")).where(summary.scheduler == "sarathi", "none")


def _versus_baseline(runs: pd.DataFrame, metric: str, keys: list[str],
                     is_baseline: pd.Series) -> pd.DataFrame:
    """Non-baseline rows with ``baseline`` (mean of the same keys' baseline runs) and ``gain``."""
    base = runs[is_baseline].groupby(keys)[metric].mean().rename("baseline")
    out = runs[~is_baseline].join(base, on=keys)
    out["gain"] = out[metric] / out.baseline
    return out.reset_index(drop=True)


def normalised_throughput(summary: pd.DataFrame, keys=WORKLOAD_KEYS) -> pd.DataFrame:
    """Throughput over the baseline's on the same workload (Fig. 9, 11)."""
    return _versus_baseline(summary, "total_throughput_tok_s", list(keys),
                            summary.scheduler == BASELINE)


def compute_bound_tokens(gflops: float, gbps: float, bytes_per_param: float) -> float:
    """From this many tokens a linear layer is compute-bound: a weight read does 2 flops a token."""
    return gflops / gbps * bytes_per_param / 2


def balance_table(name: str, gflops: float, gbps: float, bytes_per_param: float) -> pd.DataFrame:
    """The paper's A6000 (fp16) beside a measured machine: rates, flops per byte, ridge tokens."""
    machines = [("RTX A6000, fp16 (datasheet)", paper.A6000_GFLOPS, paper.A6000_GBPS, 2),
                (name, gflops, gbps, bytes_per_param)]
    return pd.DataFrame([{"machine": m, "matmul GFLOP/s": f, "memory GB/s": b,
                          "flops per byte": f / b,
                          "compute-bound from (tokens)": compute_bound_tokens(f, b, p)}
                         for m, f, b, p in machines])


def decode_over_prefill(ops: pd.DataFrame) -> pd.DataFrame:
    """Per (seq_len, batch_size): a decode's per-token time over a prefill token's."""
    total = ops[ops.op == "total"].pivot_table(index=["seq_len", "batch_size"], columns="phase",
                                               values="ms_per_token")
    return total.assign(ratio=total.decode / total.prefill).reset_index()


def saturation(rate: pd.Series, within: float = 0.9) -> dict[str, float]:
    """Fewest tokens from which ``rate`` is ``within`` of its best; that best; fewest measured."""
    rate = rate.sort_index()
    best = rate.max()
    return {"tokens": int(rate[rate >= within * best].index[0]), "tokens_per_ms": float(best),
            "fewest_measured": int(rate.index[0])}


def prefill_saturation(ops: pd.DataFrame, within: float = 0.9) -> dict[str, float]:
    """``saturation`` of prefill throughput against batch_size x seq_len (Fig. 4)."""
    prefill = ops[(ops.op == "total") & (ops.phase == "prefill")]
    return saturation(1 / prefill.groupby("tokens").ms_per_token.mean(), within)


def largest_step(times: pd.Series) -> tuple[int, float]:
    """Where the time per added token jumps most: n and the increase over the mean slope."""
    t = times.sort_index()
    slope = (t.iloc[-1] - t.iloc[0]) / (t.index[-1] - t.index[0])
    expected = t.shift(1) + slope * np.diff(t.index, prepend=np.nan)
    excess = (t - expected) / t.shift(1)
    n = int(excess.idxmax())
    return n, float(excess[n])


def iteration_ms(results) -> pd.Series:
    sweep = results.table("tile_quantization", "sweep")
    return sweep[sweep.op == "total"].groupby("tokens").ms.mean()


def pd_ratio_gains(summary: pd.DataFrame) -> pd.DataFrame:
    """Each sarathi run over the static runs just before it (same workload): drifts hit both."""
    gains = normalised_throughput(summary.assign(chunk_align=chunk_align(summary)),
                                  keys=(*WORKLOAD_KEYS, "chunk")).dropna(subset=["gain"])
    return _with_effective_chunk(gains, summary)


def chunk_batch_gains(summary: pd.DataFrame) -> pd.DataFrame:
    """Each sarathi run over its workload's static runs (Fig. 13c): static reads no chunk, so one
    baseline serves every chunk."""
    gains = normalised_throughput(summary.assign(chunk_align=chunk_align(summary)))
    return _with_effective_chunk(gains.dropna(subset=["gain"]), summary)


def _with_effective_chunk(gains: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """``effective_chunk``: the chunk each run's iterations held beside B - 1 decodes."""
    # The tile sarathi aligned to, where a sweep set it.
    tiles = summary["scheduler.tile"].dropna().unique() if "scheduler.tile" in summary else []
    tile = int(tiles[0]) if len(tiles) else paper.TILE
    return gains.assign(effective_chunk=[_effective_chunk(c, b, a, tile)
                                         for c, b, a in zip(gains.chunk, gains.batch_size,
                                                            gains.chunk_align)])


def pd_ratio_spread(summary: pd.DataFrame) -> pd.DataFrame:
    """Per sarathi point (workload, chunk, alignment): its gain's ``low`` and ``high`` over every
    repeat of both sides, and ``repeats`` (runs behind it). static ignores the chunk, so the static
    runs of one workload at every chunk and seed repeat one baseline: their range is its noise."""
    metric, keys = "total_throughput_tok_s", list(WORKLOAD_KEYS)
    runs = summary.assign(chunk_align=chunk_align(summary)).dropna(subset=[metric])
    base = (runs[runs.scheduler == BASELINE].groupby(keys)[metric]
            .agg(base_low="min", base_high="max", base_runs="count"))
    point = [*keys, "chunk", "chunk_align"]
    ours = (runs[runs.scheduler != BASELINE].groupby(point)[metric]
            .agg(ours_low="min", ours_high="max", ours_runs="count").reset_index())
    out = ours.join(base, on=keys).dropna(subset=["base_low"])
    return out.assign(low=out.ours_low / out.base_high, high=out.ours_high / out.base_low,
                      repeats=out.ours_runs + out.base_runs)[[*point, "low", "high", "repeats"]]


def _effective_chunk(chunk: float, batch_size: float, align: str, tile: int) -> float:
    if align != "tile":
        return chunk
    try:
        return aligned_chunk(int(chunk), int(batch_size) - 1, tile)
    except ValueError:
        return chunk


def optimal_pd_ratio(chunk: float, batch_size: float) -> float:
    """P:D at which one chunk and B - 1 decodes fill every iteration: C / (B - 1)."""
    return chunk / (batch_size - 1) if batch_size > 1 else float("inf")


def pd_peaks(normalised: pd.DataFrame) -> pd.DataFrame:
    """Per point: the P:D of the largest gain, the gain, the paper's predicted peak."""
    keys = ["chunk", *(["chunk_align"] if "chunk_align" in normalised else []), "batch_size",
            "seq_len"]
    idx = normalised.groupby(keys).gain.idxmax()
    ran = "effective_chunk" if "effective_chunk" in normalised else "chunk"
    peaks = normalised.loc[idx, [*keys, "pd_ratio", "gain", *([ran] if ran != "chunk" else [])]]
    peaks["predicted_pd_ratio"] = [optimal_pd_ratio(c, b)
                                   for c, b in zip(peaks[ran], peaks.batch_size)]
    return peaks.reset_index(drop=True)


def beyond_paper_device(frame: pd.DataFrame) -> pd.Series:
    """Rows with a larger batch than the paper's A6000 held at their length: what-ifs, no verdict's.
    Lengths the paper did not run (a scaled-down sweep's) hold no what-if."""
    largest = frame.seq_len.map(paper.LARGEST_BATCH)
    return (frame.batch_size > largest).fillna(False).astype(bool)


def orca_variants(summary: pd.DataFrame) -> pd.DataFrame:
    """Fig. 11a's bars: equal requests in Orca's lock step; staggered, decodes ride prefills."""
    stagger = summary.get("workload.stagger",
                          pd.Series(0, index=summary.index)).fillna(0).astype(int)
    variants = []
    for scheduler, staggered, align in zip(summary.scheduler, stagger, chunk_align(summary)):
        name = {"static": "baseline", "sarathi": "SARATHI"}.get(scheduler, scheduler)
        notes = ["tile-aligned"] * (align == "tile") + ["staggered"] * bool(staggered)
        variants.append(("Orca best" if staggered else "Orca worst") if scheduler == "orca"
                        else f"{name} ({', '.join(notes)})" if notes else name)
    return summary.assign(variant=variants)


def orca_compare(summary: pd.DataFrame, keys=WORKLOAD_KEYS) -> pd.DataFrame:
    """Throughput over the baseline (static, unstaggered) on the same lengths."""
    runs = orca_variants(summary)
    return _versus_baseline(runs, "total_throughput_tok_s", list(keys), runs.variant == "baseline")


def prefill_overlap(iterations: pd.DataFrame) -> pd.DataFrame:
    """Per run: the share of prompt-computing iterations with decodes, and their mean decodes."""
    pre = iterations[iterations.num_prefill_tokens > 0]
    grouped = pre.groupby("run_dir")
    decodes = grouped.num_decode_tokens
    return pd.DataFrame({"hybrid_share": decodes.apply(lambda d: (d > 0).mean()),
                         "decodes_per_prefill_iteration": decodes.mean()}).reset_index()


LATENCIES = ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s")


def latency_long(summary: pd.DataFrame, load: str = "workload.qps") -> pd.DataFrame:
    """One row per (scheduler, load, metric, percentile), latency in seconds."""
    long = summary.melt(id_vars=["scheduler", load], value_vars=list(LATENCIES), var_name="latency",
                        value_name="seconds")
    long[["metric", "percentile"]] = long.latency.str.removesuffix("_s").str.split("_", expand=True)
    return long.rename(columns={load: "qps"})
