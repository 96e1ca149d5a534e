"""Iteration time against the number of tokens in the batch, in fine steps (paper Fig. 7).

Each point is one prefill-only iteration of a single prompt of n tokens, n from
``measure.token_step`` to ``seq_len`` in steps of ``measure.token_step``, plus n = m + 1 for every
multiple m of ``measure.tile``: on a GPU, one token past a tile multiple costs a whole extra tile
(the paper: 256 -> 257 tokens, +32%).

The points are visited in a new random order each of ``measure.reps`` rounds, m and m + 1 back
to back, and each keeps its median: a slow spell of the machine (other work on a shared CPU) then
blurs random points instead of drawing a step into a run of neighbouring ones.
"""
from __future__ import annotations

import random
import statistics
from collections import defaultdict

import pandas as pd

from sarathi_lab.profiling.batches import SyntheticBatches
from sarathi_lab.profiling.ops import time_by_op
from sarathi_lab.profiling.quantities import tile_jump


def token_groups(max_tokens: int, step: int, tile: int) -> list[list[int]]:
    """The token counts to time, the pairs (m, m + 1) at tile multiples m kept together."""
    pairs = [[m, m + 1] for m in range(tile, max_tokens, tile)]
    paired = {n for pair in pairs for n in pair}
    return pairs + [[n] for n in range(step, max_tokens + 1, step) if n not in paired]


def run(cfg, llm) -> tuple[dict[str, float], dict[str, pd.DataFrame]]:
    m = cfg.measure
    batches = SyntheticBatches(llm, seed=cfg.seed)
    groups, order = token_groups(cfg.seq_len, m.token_step, m.tile), random.Random(cfg.seed)
    seconds = defaultdict(list)
    for _ in range(m.reps):
        order.shuffle(groups)
        for n in (n for group in groups for n in group):
            batch = batches.make(prefills=[(n, 0)])
            try:
                for op, s in time_by_op(llm, batch, reps=1).items():
                    seconds[n, op].append(s)
            finally:
                batches.free(batch)
    sweep = pd.DataFrame([{"tokens": n, "op": op, "ms": statistics.median(s) * 1e3}
                          for (n, op), s in sorted(seconds.items())])
    total = sweep[sweep.op == "total"].set_index("tokens").ms
    per_token = total / total.index
    summary = {"tile": m.tile, "token_step": m.token_step, "tile_jump": tile_jump(total, m.tile),
               "max_tokens_per_ms": float((1 / per_token).max()), "ms_at_max_tokens": float(total.iloc[-1])}
    return summary, {"sweep": sweep}
