"""Iteration time against tokens in the batch (paper Fig. 7), m + 1 beside every tile multiple m;
points visited in a new random order each round (m, m + 1 back to back), medians kept, so that a
shared machine's slow spell blurs random points instead of drawing a step."""
from __future__ import annotations

import random
import statistics
from collections import defaultdict

import pandas as pd

from sarathi_lab.analysis.quantities import tile_jump
from sarathi_lab.measure.profiling.batches import SyntheticBatches
from sarathi_lab.measure.tasks._timing import time_by_op


def token_groups(max_tokens: int, step: int, tile: int) -> list[list[int]]:
    """The pairs (m, m + 1) at tile multiples m kept together."""
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
            with batches.made(prefills=[(n, 0)]) as batch:
                # The kernels at exactly n tokens: the engine's graph of n + 1 would be the
                # next bucket's, and its padding, not the device's tile, would make the step.
                for op, s in time_by_op(llm, batch, reps=1, exact=True).items():
                    seconds[n, op].append(s)
    sweep = pd.DataFrame([{"tokens": n, "op": op, "ms": statistics.median(s) * 1e3}
                          for (n, op), s in sorted(seconds.items())])
    total = sweep[sweep.op == "total"].set_index("tokens").ms
    per_token = total / total.index
    summary = {"tile": m.tile, "token_step": m.token_step, "tile_jump": tile_jump(total, m.tile),
               "max_tokens_per_ms": float((1 / per_token).max()),
               "ms_at_max_tokens": float(total.iloc[-1])}
    return summary, {"sweep": sweep}
