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
    """Per (seq_len, batch_size, chunk), from the medians of the three iterations of
    ``task=piggyback``: a baseline decode token costs decode_only / B, a piggybacked one
    (hybrid - chunk_alone) / (B - 1), what B - 1 decodes add to the chunk (the paper's Table 2
    reading); ``gain`` is the decode throughput speedup, the first over the second."""
    ms = piggyback.pivot_table(index=["seq_len", "batch_size", "chunk"], columns="iteration", values="ms")
    out = ms.reset_index()
    out["baseline_ms_per_decode"] = ms.decode_only.to_numpy() / out.batch_size
    out["piggybacked_ms_per_decode"] = (ms.hybrid - ms.chunk_alone).to_numpy() / (out.batch_size - 1)
    out["gain"] = out.baseline_ms_per_decode / out.piggybacked_ms_per_decode
    return out
