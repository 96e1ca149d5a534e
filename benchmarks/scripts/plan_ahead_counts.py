"""plan_cost's cached replay with and without planning ahead, counted (no times): per iteration,
the plan cache's misses on the critical path (the chunks' lookup, the decodes'), and the plans
made ahead under the forward. Deterministic: the simulated run and the planner's signatures.

    PYTHONPATH=<worktree>:<worktree>/kernels python benchmarks/scripts/plan_ahead_counts.py \
        [requests] [batch] [chunk]
"""
import sys
from collections import Counter

import torch
from sarathi_kernels import chunk_plan
from sarathi_kernels.attention_plan import plan_batch
from sarathi_kernels.occupancy import H100

from sarathi_lab.attention.triton_backend import TritonAttention
from sarathi_lab.measure.bench import plan_cost
from sarathi_lab.model.presets import PRESETS
from sarathi_lab.model.shape import Shape
from sarathi_lab.tuned_kernels import table_named, using

requests, batch, chunk = (int(a) for a in (sys.argv[1:] + ["64", "128", "512"][len(sys.argv) - 1:]))
likely = []
seen = plan_cost.batches(requests, batch, chunk, (256, 3072), (64, 512), likely)
shape = Shape.of(PRESETS[plan_cost.MODEL])
with using(table_named(plan_cost.DEVICE_NAME)):
    backend = TritonAttention()
    probe = torch.empty(1, 1, shape.kv_heads, shape.head_dim, dtype=torch.bfloat16)
    tiles, rule = backend._tiles(probe), backend._rule(probe)


def plan(query_lens, seq_lens, prefills):
    plan_batch(query_lens, seq_lens, shape.heads, shape.kv_heads, num_prefills=prefills,
               limits=H100, tiles=tiles, rule=rule)


for ahead in (False, True):
    chunk_plan.clear_plan_cache()
    missed, lookups, made_ahead = Counter(), 0, 0
    for i, (query_lens, seq_lens, prefills, _) in enumerate(seen):
        before = chunk_plan.plan_cache_counts()
        plan(query_lens, seq_lens, prefills)
        after = chunk_plan.plan_cache_counts()
        misses = after["misses"] - before["misses"]
        lookups += sum(after.values()) - sum(before.values())
        missed[misses] += 1
        if ahead and likely[i] is not None:
            plan(likely[i].query_lens, likely[i].seq_lens, likely[i].num_prefills)
            made_ahead += chunk_plan.plan_cache_counts()["misses"] - after["misses"]
    hits = lookups - sum(n * k for k, n in missed.items())
    print(f"ahead={ahead}: {len(seen)} iterations, {lookups} critical lookups, hit rate "
          f"{hits / lookups:.3f}; iterations by critical misses {dict(sorted(missed.items()))}; "
          f"plans made ahead {made_ahead}")
