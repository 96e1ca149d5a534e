"""What a decode costs alone and riding a prefill chunk (paper Table 2 and Fig. 8).

Three iterations at batch size B, every decode at ``seq_len`` tokens of context: B decodes alone, a
chunk alone, and the chunk with B - 1 decodes (SARATHI's decode-maximal batch); the costs and the
speedup are ``profiling.quantities.decode_speedup``. Each is timed ``measure.reps`` times in a new
random order each round and keeps its median, which a shared CPU's slow spells blur less than the
difference of two served iterations. The chunk is ``chunk`` as the run's scheduler would run it beside
B - 1 decodes: tile-aligned where its scheduler aligns its chunks (``chunk_of``).
"""
from __future__ import annotations

import random
import statistics
from typing import TYPE_CHECKING

import pandas as pd

from sarathi_lab.config import ConfigError
from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.tiles import aligned_chunk
from sarathi_lab.harness.tasks._timing import forward_timer
from sarathi_lab.profiling.batches import SyntheticBatches
from sarathi_lab.profiling.quantities import decode_speedup

if TYPE_CHECKING:
    from sarathi_lab.engine.scheduler import SchedulerConfig
    from sarathi_lab.plan import EnginePlan


def chunk_of(cfg, sched: SchedulerConfig) -> int:
    """The chunk the B - 1 decodes ride: ``chunk``, aligned as the run's own scheduler aligns its chunks
    (``sched``, the plan's typed config: tile-aligned, shrunk so that chunk and decodes fill whole
    scheduler.tile-token tiles, as SARATHI sized its chunks). Where no aligned chunk exists the scheduler
    would run the chunk as set: so does this task under chunk_align=auto; asked for tile, it refuses."""
    if sched.chunk_alignment == "none":
        return cfg.chunk
    try:
        return aligned_chunk(cfg.chunk, cfg.batch_size - 1, sched.tile)
    except ValueError as e:
        if sched.chunk_align == "auto":
            return cfg.chunk
        raise ConfigError(f"{sched.setting('chunk_align')} is invalid with task=piggyback, chunk={cfg.chunk}, "
                          f"batch_size={cfg.batch_size}, {sched.setting('tile')}: {e}; allowed: none, or a larger "
                          "chunk") from None


def kv_requests(cfg, plan: EnginePlan) -> list[int]:
    """The lengths of the requests it holds in the KV cache at once: the chunk's and the decodes'."""
    return [chunk_of(cfg, plan.scheduler_config)] + [cfg.seq_len] * cfg.batch_size


def run(cfg, llm) -> tuple[dict[str, float], dict[str, pd.DataFrame]]:
    size, context = cfg.batch_size, cfg.seq_len  # at least 2 (RunConfig): B - 1 decodes ride the chunk
    sched = llm.plan.scheduler_config
    tokens = chunk_of(cfg, sched)
    batches = SyntheticBatches(llm, seed=cfg.seed)
    # One chunk and B decodes serve all three iterations, so the cache holds them once.
    with batches.made(prefills=[(tokens, 0)], decodes=size, context=context) as requests:
        chunk, decodes = requests.prefills, requests.decodes
        made = {"decode_only": ScheduledBatch(decodes=decodes), "chunk_alone": ScheduledBatch(prefills=chunk),
                "hybrid": ScheduledBatch(prefills=chunk, decodes=decodes[1:])}
        timers = {kind: forward_timer(llm, batch) for kind, batch in made.items()}
        seconds = {kind: [] for kind in made}
        order = random.Random(cfg.seed)
        for _ in range(cfg.measure.reps):
            for kind in order.sample(list(made), len(made)):
                seconds[kind].append(timers[kind]())
    # The reps' range beside their median: the noise a difference of two iterations is judged against.
    table = pd.DataFrame([{"iteration": kind, "ms": statistics.median(s) * 1e3, "ms_min": min(s) * 1e3,
                           "ms_max": max(s) * 1e3, "tokens": made[kind].num_tokens}
                          for kind, s in seconds.items()]).assign(chunk_align=sched.chunk_alignment)
    row = decode_speedup(table.assign(seq_len=context, batch_size=size, chunk=tokens)).iloc[0]
    summary = {k: float(row[k]) for k in ("baseline_ms_per_decode", "piggybacked_ms_per_decode")}
    return summary | {"decode_speedup": float(row.gain)}, {"piggyback": table}
