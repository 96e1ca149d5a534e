"""The paper's quantities a task reports and the analysis recomputes: one definition."""
from __future__ import annotations

import numpy as np
import pandas as pd


def tile_jump(times: pd.Series, tile: int) -> float:
    """Mean relative increase from m to m + 1 tokens over the multiples m of ``tile`` measured."""
    pairs = [(m, m + 1) for m in times.index if m % tile == 0 and m + 1 in times.index]
    if not pairs:
        return float("nan")
    return float(np.mean([times[b] / times[a] - 1 for a, b in pairs]))


def _time_noise(piggyback: pd.DataFrame, point: list[str]) -> pd.Series:
    """Range of each row's time over its point's repeats (seeds' medians, else reps), else 0."""
    if "seed" in piggyback and piggyback.seed.nunique() > 1:
        grouped = piggyback.groupby([*point, "iteration"]).ms
        return grouped.transform("max") - grouped.transform("min")
    if {"ms_min", "ms_max"} <= set(piggyback):
        return (piggyback.ms_max - piggyback.ms_min).fillna(0.0)
    return pd.Series(0.0, index=piggyback.index)


def decode_speedup(piggyback: pd.DataFrame) -> pd.DataFrame:
    """A decode costs decode_only / B alone, (hybrid - chunk_alone) / (B - 1) riding (Table 2).
    Seeds stay apart (averaging in a noise-lost difference misleads); unresolved: ``gain`` NaN."""
    point = ["seq_len", "batch_size", "chunk",
             *(["chunk_align"] if "chunk_align" in piggyback else [])]
    keys = [*point, *(["seed"] if "seed" in piggyback and piggyback.seed.nunique() > 1 else [])]
    piggyback = piggyback.assign(noise_ms=_time_noise(piggyback, point))
    ms = piggyback.pivot_table(index=keys, columns="iteration", values="ms")
    noise = piggyback.pivot_table(index=keys, columns="iteration", values="noise_ms")
    out = ms.reset_index()
    out.columns.name = None
    difference = (ms.hybrid - ms.chunk_alone).to_numpy()
    out["baseline_ms_per_decode"] = ms.decode_only.to_numpy() / out.batch_size
    out["piggybacked_ms_per_decode"] = difference / (out.batch_size - 1)
    out["gain"] = out.baseline_ms_per_decode / out.piggybacked_ms_per_decode
    out["noise_ms"] = (noise.hybrid + noise.chunk_alone).to_numpy()
    # Within the two times' summed ranges a ratio is only a bound.
    out["resolved"] = ~(difference <= out.noise_ms.to_numpy())
    upper = np.maximum(difference, 0.0) + out.noise_ms.to_numpy()
    with np.errstate(divide="ignore"):
        bound = out.baseline_ms_per_decode / (upper / (out.batch_size - 1))
    out["gain_bound"] = np.where(out.resolved, np.nan, np.where(np.isfinite(bound), bound, np.nan))
    return out
