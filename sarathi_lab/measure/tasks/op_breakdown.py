"""Per-token time of prefill and of decode at one batch size, split by operation (Fig. 3/4)."""
from __future__ import annotations

import pandas as pd

from sarathi_lab.measure.profiling.batches import SyntheticBatches
from sarathi_lab.measure.tasks._timing import time_by_op


def kv_requests(cfg, plan) -> list[int]:
    return [cfg.seq_len] * cfg.batch_size


def run(cfg, llm) -> tuple[dict[str, float], dict[str, pd.DataFrame]]:
    size, length = cfg.batch_size, cfg.seq_len
    batches = SyntheticBatches(llm, seed=cfg.seed)
    rows = []
    for phase, spec in (("prefill", {"prefills": [(length, 0)] * size}),
                        ("decode", {"decodes": size, "context": length})):
        with batches.made(**spec) as batch:
            seconds = time_by_op(llm, batch, cfg.measure.reps)
        rows += [{"phase": phase, "op": op, "tokens": batch.num_tokens, "ms": s * 1e3,
                  "ms_per_token": s * 1e3 / batch.num_tokens} for op, s in seconds.items()]
    ops = pd.DataFrame(rows)
    per_token = ops[ops.op == "total"].set_index("phase").ms_per_token
    summary = {"prefill_ms_per_token": per_token.prefill, "decode_ms_per_token": per_token.decode,
               "decode_over_prefill": per_token.decode / per_token.prefill,
               "prefill_tokens_per_ms": 1 / per_token.prefill,
               "decode_tokens_per_ms": 1 / per_token.decode}
    return summary, {"ops": ops}
