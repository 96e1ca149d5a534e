"""chunk_plan.plan_chunks at a past commit against the worktree's, on the plans plan_cost's replay
misses: whether each plan is the same, the candidate plans each builds, and the old / new planning
time, timed interleaved in one process (a ratio: absolute times on a shared machine mean little);
then plan_cost's whole cached replay (attention_plan.plan_batch an iteration) with either module's
planner, interleaved an iteration at a time.

    PYTHONPATH=<worktree>:<worktree>/kernels python benchmarks/scripts/plan_cost_ab.py \
        [old_commit] [requests] [repeats]

The old module is read with ``git show`` from the worktree's history.
"""
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from sarathi_kernels import chunk_plan

from sarathi_lab.measure.bench import plan_cost

old_rev = sys.argv[1] if len(sys.argv) > 1 else "0b483d4"
requests = int(sys.argv[2]) if len(sys.argv) > 2 else 64
repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 3

source = subprocess.run(["git", "show", f"{old_rev}:kernels/sarathi_kernels/chunk_plan.py"],
                        capture_output=True, text=True, check=True).stdout
old_path = Path(tempfile.mkdtemp()) / "old_chunk_plan.py"
old_path.write_text(source)
spec = importlib.util.spec_from_file_location("old_chunk_plan", old_path)
old = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = old  # dataclasses look their module up
spec.loader.exec_module(old)

# The misses of plan_cost's cached replay: every plan_chunks call, as the backend makes it.
calls, real = [], chunk_plan.plan_chunks
chunk_plan.plan_chunks = lambda *a, **k: calls.append((a, k)) or real(*a, **k)
seen = plan_cost.batches(requests, 128, 512, (256, 3072), (64, 512))
cached = plan_cost.replay(seen)
chunk_plan.plan_chunks = real


def built(module, a, k) -> int:
    """Candidate plans ``module`` builds for one call (its _pieces and _flat evaluations)."""
    count, originals = [0], {name: getattr(module, name) for name in ("_pieces", "_flat")}
    for name, fn in originals.items():
        setattr(module, name, lambda *x, _fn=fn: count.__setitem__(0, count[0] + 1) or _fn(*x))
    try:
        module.plan_chunks(*a, **k)
    finally:
        for name, fn in originals.items():
            setattr(module, name, fn)
    return count[0]


same, t_old, t_new = 0, [], []
for a, k in calls:
    w_old, w_new = old.plan_chunks(*a, **k), real(*a, **k)
    same += all(np.array_equal(getattr(w_old, f), getattr(w_new, f))
                for f in ("items", "work_indptr", "row_splits")) and \
        (w_old.critical_path, w_old.planned_cost) == (w_new.critical_path, w_new.planned_cost)
    for _ in range(repeats):  # interleaved: the machine's load falls on both alike
        for fn, times in ((old.plan_chunks, t_old), (real, t_new)):
            start = time.perf_counter_ns()
            fn(*a, **k)
            times.append(time.perf_counter_ns() - start)
walks = [len(old.tile_walks(a[0], a[1], a[3], a[4])[2]) * a[2] for a, _ in calls]
b_old = [built(old, a, k) for a, k in calls]
b_new = [built(chunk_plan, a, k) for a, k in calls]
t_old, t_new = np.array(t_old) / 1e3, np.array(t_new) / 1e3
print(f"{requests} requests: {len(seen)} iterations, hit rate {cached['hit_rate']:.3f}, "
      f"{len(calls)} plans made; same plan {same}/{len(calls)}; walks a plan "
      f"{np.mean(walks):.0f} mean, {max(walks)} most")
print(f"candidate plans built a plan: old {np.mean(b_old):.2f}, new {np.mean(b_new):.2f}")
print(f"plan_chunks us (this machine, shared): old median {np.median(t_old):.0f} p99 "
      f"{np.percentile(t_old, 99):.0f}; new median {np.median(t_new):.0f} p99 "
      f"{np.percentile(t_new, 99):.0f}; old / new: total {t_old.sum() / t_new.sum():.2f}, "
      f"median {np.median(t_old) / np.median(t_new):.2f}")


def replay_times(modules) -> list[np.ndarray]:
    """plan_batch's time an iteration (us) with each module's planner, cached as the engine runs."""
    import torch
    from sarathi_kernels import attention_plan
    from sarathi_kernels.occupancy import H100

    from sarathi_lab.attention.triton_backend import TritonAttention
    from sarathi_lab.model.presets import PRESETS
    from sarathi_lab.model.shape import Shape
    from sarathi_lab.tuned_kernels import table_named, using

    shape = Shape.of(PRESETS[plan_cost.MODEL])
    with using(table_named(plan_cost.DEVICE_NAME)):
        backend = TritonAttention()
        probe = torch.empty(1, 1, shape.kv_heads, shape.head_dim, dtype=torch.bfloat16)
        tiles, rule = backend._tiles(probe), backend._rule(probe)
    times = [[] for _ in modules]
    for module in modules:
        module.clear_plan_cache()
    for query_lens, seq_lens, prefills, _ in seen:
        for module, out in zip(modules, times):
            attention_plan.cached_chunks, attention_plan.plan_decodes = module.cached_chunks, \
                module.plan_decodes
            start = time.perf_counter_ns()
            attention_plan.plan_batch(query_lens, seq_lens, shape.heads, shape.kv_heads,
                                      num_prefills=prefills, limits=H100, tiles=tiles, rule=rule)
            out.append((time.perf_counter_ns() - start) / 1e3)
    attention_plan.cached_chunks, attention_plan.plan_decodes = chunk_plan.cached_chunks, \
        chunk_plan.plan_decodes
    return [np.array(t) for t in times]


forward_us = np.array([f for *_, f in seen]) * 1e6
for label, us in zip(("old", "new"), replay_times([old, chunk_plan])):
    print(f"plan_batch an iteration, {label}: median {np.median(us):.0f} us, p99 "
          f"{np.percentile(us, 99):.0f} us, p99 share of the predicted forward "
          f"{np.percentile(us / forward_us, 99):.1%}")
