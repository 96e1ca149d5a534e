"""The quantities more than one paper result derives, and the pure-pandas helpers they share, from
``load_runs`` frames, testable by hand. A quantity one result alone derives is in its module
(analysis/paper_results/<name>.py)."""
from __future__ import annotations

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


def versus_baseline(runs: pd.DataFrame, metric: str, keys: list[str],
                     is_baseline: pd.Series) -> pd.DataFrame:
    """Non-baseline rows with ``baseline`` (mean of the same keys' baseline runs) and ``gain``."""
    base = runs[is_baseline].groupby(keys)[metric].mean().rename("baseline")
    out = runs[~is_baseline].join(base, on=keys)
    out["gain"] = out[metric] / out.baseline
    return out.reset_index(drop=True)


def normalised_throughput(summary: pd.DataFrame, keys=WORKLOAD_KEYS) -> pd.DataFrame:
    """Throughput over the baseline's on the same workload (Fig. 9, 11)."""
    return versus_baseline(summary, "total_throughput_tok_s", list(keys),
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


def with_effective_chunk(gains: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """``effective_chunk``: the chunk each run's iterations held beside B - 1 decodes."""
    # The tile sarathi aligned to, where a sweep set it.
    tiles = summary["scheduler.tile"].dropna().unique() if "scheduler.tile" in summary else []
    tile = int(tiles[0]) if len(tiles) else paper.TILE
    return gains.assign(effective_chunk=[_effective_chunk(c, b, a, tile)
                                         for c, b, a in zip(gains.chunk, gains.batch_size,
                                                            gains.chunk_align)])


def _effective_chunk(chunk: float, batch_size: float, align: str, tile: int) -> float:
    if align != "tile":
        return chunk
    try:
        return aligned_chunk(int(chunk), int(batch_size) - 1, tile)
    except ValueError:
        return chunk


def beyond_paper_device(frame: pd.DataFrame) -> pd.Series:
    """Rows with a larger batch than the paper's A6000 held at their length: what-ifs, no verdict's.
    Lengths the paper did not run (a scaled-down sweep's) hold no what-if."""
    largest = frame.seq_len.map(paper.LARGEST_BATCH)
    return (frame.batch_size > largest).fillna(False).astype(bool)


