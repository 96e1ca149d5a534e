"""The paper's quantities that a measurement task reports and the analysis recomputes from the
tables it leaves: one definition for both, below them."""
from __future__ import annotations

import numpy as np
import pandas as pd


def tile_jump(times: pd.Series, tile: int) -> float:
    """Mean relative increase of the time from m to m + 1 tokens over the multiples m of ``tile``
    measured; ``times`` is indexed by token count."""
    pairs = [(m, m + 1) for m in times.index if m % tile == 0 and m + 1 in times.index]
    if not pairs:
        return float("nan")
    return float(np.mean([times[b] / times[a] - 1 for a, b in pairs]))


def decode_speedup(piggyback: pd.DataFrame) -> pd.DataFrame:
    """Per (seq_len, batch_size, chunk; chunk_align and seed where recorded), from the medians of
    ``task=piggyback``'s three iterations: a baseline decode token costs decode_only / B, a piggybacked
    one (hybrid - chunk_alone) / (B - 1) (the paper's Table 2 reading); ``gain`` is the first over the
    second. Seeds stay apart: averaging a difference of two times that vanished into noise with one
    that did not makes a speedup neither measured."""
    keys = ["seq_len", "batch_size", "chunk", *(["chunk_align"] if "chunk_align" in piggyback else []),
            *(["seed"] if "seed" in piggyback and piggyback.seed.nunique() > 1 else [])]
    ms = piggyback.pivot_table(index=keys, columns="iteration", values="ms")
    out = ms.reset_index()
    out["baseline_ms_per_decode"] = ms.decode_only.to_numpy() / out.batch_size
    out["piggybacked_ms_per_decode"] = (ms.hybrid - ms.chunk_alone).to_numpy() / (out.batch_size - 1)
    out["gain"] = out.baseline_ms_per_decode / out.piggybacked_ms_per_decode
    return out
