"""The host cost of planning balanced attention work (kernels' chunk_plan.py) per iteration: a
simulated serving run's batches (LLaMA-13B on the H100 the simulator predicts) replayed through the
planner the engine's Triton backend calls on a GPU, its plan cache's hit rate, and its time against
the predicted forward pass. Target: planning under 2% of the iteration."""
from __future__ import annotations

import time

import numpy as np
import torch

from sarathi_lab.measure.bench.args import int_range, positive_int
from sarathi_lab.measure.bench.case import Case, Report
from sarathi_lab.measure.bench.trace import requests_refused, workload

MODEL, GPU, DEVICE_NAME = "llama-13b", "h100", "NVIDIA H100 80GB HBM3"
TARGET = 0.02
# Poisson arrivals fast enough that the batch fills (mixed contexts, chunks beside decodes).
RATE_RPS = 8.0


def batches(requests: int, batch: int, chunk: int, prompt_tokens, decode_tokens,
            likely: list | None = None):
    """Each iteration's (query lengths, contexts, prefills, predicted forward s), simulated; into
    ``likely`` the scheduler's guess at each one's successor (the engine plans it ahead on CUDA)."""
    from sarathi_lab import LLM
    from sarathi_lab.sim.executor import composition

    llm = LLM(MODEL, executor="sim", sim_device=GPU, scheduler="sarathi_serve", chunk_size=chunk,
              max_batch_size=batch)
    executor, seen = llm.engine.executor, []
    execute = executor.execute

    def recorded(b):
        if likely is not None:
            likely.append(llm.engine.scheduler.likely_next(b))
        out = execute(b)
        prefills, decodes = composition(b)
        seen.append(([q for q, _ in prefills] + [1] * len(decodes),
                     [c for _, c in prefills] + decodes, len(prefills), out.forward_s))
        return out

    executor.execute = recorded
    prompts, new, arrivals = workload(requests, prompt_tokens, decode_tokens, RATE_RPS)
    llm.generate(prompts, new, arrival_times=arrivals)
    return seen


def replay(seen, cached: bool = True, likely: list | None = None) -> dict:
    """Every batch planned as the engine's Triton backend plans it on an H100 (the device's tuned
    tiles and split rule), in order: the plan cache's hit rate and planning time per iteration;
    ``cached`` False: every plan made afresh; ``likely`` (batches'): each batch's guessed successor
    planned after it, under its forward, as the engine does on CUDA (hit_rate: the critical path's
    lookups only)."""
    from sarathi_kernels import chunk_plan
    from sarathi_kernels.attention_plan import plan_batch
    from sarathi_kernels.occupancy import H100

    from sarathi_lab.attention.triton_backend import TritonAttention
    from sarathi_lab.model.presets import PRESETS
    from sarathi_lab.model.shape import Shape
    from sarathi_lab.tuned_kernels import table_named, using

    shape = Shape.of(PRESETS[MODEL])
    with using(table_named(DEVICE_NAME)):
        backend = TritonAttention()
        probe = torch.empty(1, 1, shape.kv_heads, shape.head_dim, dtype=torch.bfloat16)
        tiles, rule = backend._tiles(probe), backend._rule(probe)

    def planned_us(query_lens, seq_lens, prefills) -> float:
        start = time.perf_counter_ns()
        plan_batch(query_lens, seq_lens, shape.heads, shape.kv_heads, num_prefills=prefills,
                   limits=H100, tiles=tiles, rule=rule)
        return (time.perf_counter_ns() - start) / 1e3

    chunk_plan.clear_plan_cache()
    times, exposed, total, ahead_us = [], [], {"hits": 0, "misses": 0}, 0.0
    for i, (query_lens, seq_lens, prefills, forward_s) in enumerate(seen):
        if not cached:
            chunk_plan.clear_plan_cache()
        before = chunk_plan.plan_cache_counts()  # the critical path's lookups only
        times.append(planned_us(query_lens, seq_lens, prefills))
        for kind, n in chunk_plan.plan_cache_counts().items():
            total[kind] += n - before[kind]
        # Planning ahead shows only where it outlasted the forward it ran under.
        exposed.append(times[-1] + ahead_us)
        ahead = likely[i] if likely is not None else None
        ahead_us = 0.0 if ahead is None else max(0.0, planned_us(
            ahead.query_lens, ahead.seq_lens, ahead.num_prefills) - forward_s * 1e6)
    chunk_plan.clear_plan_cache()
    lookups = total["hits"] + total["misses"]
    return {"hit_rate": 1 - total["misses"] / max(lookups, 1), "plan_us": np.array(times),
            "exposed_us": np.array(exposed)}


def summarize(seen, result: dict, label: str) -> dict:
    plan_us, forward_us = result["plan_us"], np.array([f for *_, f in seen]) * 1e6
    share, exposed = plan_us / forward_us, result["exposed_us"] / forward_us
    return {"planner": label, "iterations": len(seen), "hit_rate": result["hit_rate"],
            "plan_median_us": float(np.median(plan_us)),
            "plan_p99_us": float(np.percentile(plan_us, 99)),
            "forward_median_us": float(np.median(forward_us)),
            "plan_share_median": float(np.median(share)), "plan_share_mean": float(share.mean()),
            "plan_share_p99": float(np.percentile(share, 99)),
            "exposed_share_p99": float(np.percentile(exposed, 99)),
            "met": bool(np.percentile(exposed, 99) < TARGET)}


def knobs(p) -> None:
    p.add_argument("--requests", type=positive_int, default=128)
    p.add_argument("--batch", type=positive_int, default=128, help="max_batch_size")
    p.add_argument("--chunk", type=positive_int, default=512, help="sarathi chunk size")
    p.add_argument("--prompt-tokens", type=int_range, default=(256, 3072),
                   help="N, or LO-HI drawn uniformly")
    p.add_argument("--decode-tokens", type=int_range, default=(64, 512),
                   help="N, or LO-HI drawn uniformly")


def start(args) -> None:
    from sarathi_kernels import plan_native

    plan_native.available()  # the planner built (once a machine) before anything is timed
    args.likely = []
    args.seen = batches(args.requests, args.batch, args.chunk, args.prompt_tokens,
                        args.decode_tokens, args.likely)


def report(args, table) -> Report:
    from sarathi_kernels import plan_native

    planner = plan_native.planner()
    shown = planner if planner == "compiled" else f"{planner}: no C++ compiler"
    return Report([(f"# {MODEL} on a simulated {GPU}: {args.requests} requests, sarathi_serve "
                    f"chunk {args.chunk}, batch <= {args.batch}; host planning ({shown}) timed "
                    "on this CPU (unreliable while it is shared)")],
                  f"Attention planning per iteration against the predicted {GPU} forward "
                  f"(target: p99 share < {TARGET:.0%})",
                  {"model": MODEL, "gpu": GPU, "host_planner": planner})


CASE = Case(name="plan_cost",
            reference=f"peer: the {GPU} forward the simulator predicts per iteration; the planner "
                      f"uncached; target: p99 share under {TARGET:.0%}",
            grid=lambda args: [(True, False, "cached"), (True, True, "cached+ahead"),
                               (False, False, "uncached")],
            measure=lambda args, point: summarize(args.seen, replay(
                args.seen, point[0], args.likely if point[1] else None), point[2]),
            report=report, knobs=knobs, start=start, shared=(), machine=False,
            check=lambda args: requests_refused(args.requests, args.prompt_tokens,
                                                args.decode_tokens),
            smoke={"requests": 8, "prompt_tokens": (64, 512), "decode_tokens": (8, 32)})
main = CASE.run
