"""What a decode costs alone and riding a prefill chunk (paper Table 2 and Fig. 8): the three
iterations timed in a new random order each round, medians kept, which a shared CPU's slow spells
blur less than the difference of two served iterations."""
from __future__ import annotations

import random
import statistics
from typing import TYPE_CHECKING

import pandas as pd

from sarathi_lab.analysis.quantities import decode_speedup
from sarathi_lab.config import ConfigError
from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.tiles import aligned_chunk
from sarathi_lab.measure.profiling.batches import SyntheticBatches
from sarathi_lab.measure.tasks._timing import forward_timer

if TYPE_CHECKING:
    from sarathi_lab.engine.scheduler import SchedulerConfig
    from sarathi_lab.plan import EnginePlan


def chunk_of(cfg, sched: SchedulerConfig) -> int:
    """``chunk`` aligned as the run's scheduler aligns it beside B - 1 decodes; where no aligned
    chunk exists, as set under chunk_align=auto, refused under tile."""
    if sched.chunk_alignment == "none":
        return cfg.chunk
    try:
        return aligned_chunk(cfg.chunk, cfg.batch_size - 1, sched.tile)
    except ValueError as e:
        if sched.chunk_align == "auto":
            return cfg.chunk
        raise ConfigError("chunk_align", sched.chunk_align,
                          f"is invalid with task=piggyback, chunk={cfg.chunk}, "
                          f"batch_size={cfg.batch_size}, " + sched.setting("tile") + f": {e}",
                          "none, or a larger chunk") from None


def kv_requests(cfg, plan: EnginePlan) -> list[int]:
    """The chunk's and the decodes' lengths, held in the KV cache at once."""
    return [chunk_of(cfg, plan.scheduler_config)] + [cfg.seq_len] * cfg.batch_size


def run(cfg, llm) -> tuple[dict[str, float], dict[str, pd.DataFrame]]:
    # At least 2 (RunConfig): B - 1 decodes ride the chunk.
    size, context = cfg.batch_size, cfg.seq_len

    sched = llm.plan.scheduler_config
    tokens = chunk_of(cfg, sched)
    batches = SyntheticBatches(llm, seed=cfg.seed)
    # One chunk and B decodes serve all three iterations, so the cache holds them once.
    with batches.made(prefills=[(tokens, 0)], decodes=size, context=context) as requests:
        chunk, decodes = requests.prefills, requests.decodes
        made = {"decode_only": ScheduledBatch(decodes=decodes),
                "chunk_alone": ScheduledBatch(prefills=chunk),
                "hybrid": ScheduledBatch(prefills=chunk, decodes=decodes[1:])}
        timers = {kind: forward_timer(llm, batch) for kind, batch in made.items()}
        seconds = {kind: [] for kind in made}
        order = random.Random(cfg.seed)
        for _ in range(cfg.measure.reps):
            for kind in order.sample(list(made), len(made)):
                seconds[kind].append(timers[kind]())
    # The reps' range beside their median: the noise a difference of two is judged against.
    table = pd.DataFrame([{"iteration": kind, "ms": statistics.median(s) * 1e3,
                           "ms_min": min(s) * 1e3, "ms_max": max(s) * 1e3,
                           "tokens": made[kind].num_tokens}
                          for kind, s in seconds.items()]).assign(chunk_align=sched.chunk_alignment)
    row = decode_speedup(table.assign(seq_len=context, batch_size=size, chunk=tokens)).iloc[0]
    summary = {k: float(row[k]) for k in ("baseline_ms_per_decode", "piggybacked_ms_per_decode")}
    return summary | {"decode_speedup": float(row.gain)}, {"piggyback": table}
