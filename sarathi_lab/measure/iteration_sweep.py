"""Iteration time against the number of tokens in the batch, in fine steps (paper Fig. 7).

Each point is one prefill-only iteration of a single prompt of n tokens, n from
``measure.token_step`` to ``seq_len`` in steps of ``measure.token_step``, plus n = m + 1 for every
multiple m of ``measure.tile``: on a GPU, one token past a tile multiple costs a whole extra tile
(the paper: 256 -> 257 tokens, +32%).
"""
from __future__ import annotations

import pandas as pd

from sarathi_lab.analysis.derive import tile_jump
from sarathi_lab.measure.batches import SyntheticBatches
from sarathi_lab.measure.op_timer import time_by_op


def token_counts(max_tokens: int, step: int, tile: int) -> list[int]:
    past_tile = {m + 1 for m in range(tile, max_tokens, tile)}
    return sorted(set(range(step, max_tokens + 1, step)) | past_tile)


def run(cfg, llm) -> tuple[dict[str, float], dict[str, pd.DataFrame]]:
    m = cfg.measure
    batches = SyntheticBatches(llm, cfg.seed)
    rows = []
    for n in token_counts(cfg.seq_len, m.token_step, m.tile):
        batch = batches.make(prefills=[(n, 0)])
        try:
            seconds = time_by_op(llm, batch, m.reps)
        finally:
            batches.free(batch)
        rows += [{"tokens": n, "op": op, "ms": s * 1e3} for op, s in seconds.items()]
    sweep = pd.DataFrame(rows)
    total = sweep[sweep.op == "total"].set_index("tokens").ms
    per_token = total / total.index
    summary = {"tile": m.tile, "token_step": m.token_step, "tile_jump": tile_jump(total, m.tile), "max_tokens_per_ms": float((1 / per_token).max()),
               "ms_at_max_tokens": float(total.iloc[-1])}
    return summary, {"sweep": sweep}
