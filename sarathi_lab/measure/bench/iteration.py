"""Iteration efficiency: one engine iteration's time as a multiple of its roofline floor, for
decode, prefill and hybrid batches (method: docs/benchmarks.md)."""
from __future__ import annotations

import math
from dataclasses import asdict
from functools import partial

import pandas as pd

from sarathi_lab import host_load as load
from sarathi_lab.config import EngineConfig
from sarathi_lab.engine.block_manager import blocks_for
from sarathi_lab.engine.timer import make_clock, median_time
from sarathi_lab.measure.bench.args import hybrid_pairs, positive_int, positive_ints
from sarathi_lab.measure.bench.case import SHARED, Case, Report
from sarathi_lab.measure.profiling.batches import LAYOUTS, SyntheticBatches
from sarathi_lab.measure.profiling.ceilings import SMOKE as CEILING_SMOKE
from sarathi_lab.measure.profiling.ceilings import measure_ceilings
from sarathi_lab.model.floors import floor
from sarathi_lab.model.shape import Shape

# (case, size) -> the most its time may be as a multiple of its floor.
TARGETS = {("decode", 8): 2.0, ("prefill", 256): 1.3, ("prefill", 512): 1.3}


def cases(args) -> list[dict]:
    out = [{"kind": "decode", "size": b, "prefill": None, "decodes": b}
           for b in args.decode_batches]
    out += [{"kind": "prefill", "size": c, "prefill": (c, 0), "decodes": 0}
            for c in args.prefill_chunks]
    out += [{"kind": "hybrid", "size": c, "prefill": (c, c), "decodes": d} for c, d in args.hybrid]
    return out


def blocks_needed(args, block_size: int) -> int:
    """Runs and scattered blocks come from separate halves."""
    context = blocks_for(args.decode_context, block_size)
    per = max(blocks_for(sum(case["prefill"] or ()), block_size) + case["decodes"] * context
              for case in cases(args))
    return 2 * (per + 8)


def time_case(llm, batches: SyntheticBatches, case: dict, decode_context: int, reps: int,
              clock: str = "wall") -> dict:
    executor = llm.engine.executor
    prefills = [case["prefill"]] if case["prefill"] else []
    timer = make_clock(clock, llm.device)
    with batches.made(prefills, case["decodes"], decode_context) as batch:
        prepared = executor.runner.prepare(batch)
        prep_s = median_time(lambda: executor.runner.prepare(batch), reps, timer)
        # a graph replay where the engine has one
        fwd_s = median_time(lambda: executor.forward(prepared), reps, timer)
        iter_s = median_time(lambda: executor.execute(batch), reps, timer)
        meta, num_sampled = prepared.meta, len(batch.sampled)
    return {"prep_s": prep_s, "fwd_s": fwd_s, "iter_s": iter_s,
            "query_lens": list(meta.query_lens_host), "context_lens": list(meta.seq_lens_host),
            "num_sampled": num_sampled}


def start(args) -> None:
    from sarathi_lab import LLM

    ceilings = partial(measure_ceilings, args.device, args.torch_dtype,
                       **(CEILING_SMOKE if args.smoke else {}), clock=args.clock)
    before = ceilings()
    num_blocks = blocks_needed(args, EngineConfig.block_size)
    llm = LLM(args.model, num_kv_blocks=num_blocks, device=args.device, dtype=args.dtype,
              cpu_linear=args.cpu_linear, warmup_iters=0,
              max_batch_size=max([*args.decode_batches, *(d + 1 for _, d in args.hybrid), 1]))
    vars(args).update(ceilings=ceilings, before=before, llm=llm,
                           shape=Shape.of(llm.model_config), elem=llm.dtype.itemsize,
                           batches=SyntheticBatches(llm, seed=args.seed, layout=args.layout))


def measure(args, case: dict) -> dict:
    # One untimed pass grows the attention workspace and warms the weights' pages.
    time_case(args.llm, args.batches, case, args.decode_context, 1)
    t = time_case(args.llm, args.batches, case, args.decode_context, args.reps, args.clock)
    after = args.ceilings()
    copy_gbps = max(args.before.copy_gbps, after.copy_gbps)
    matmul_gflops = max(args.before.matmul_gflops, after.matmul_gflops)
    args.before = after
    f = floor(args.shape, t["query_lens"], t["context_lens"], t["num_sampled"], args.elem,
              copy_gbps, matmul_gflops)
    target = TARGETS.get((case["kind"], case["size"]))
    ratio = t["iter_s"] / f.seconds
    return {
        "case": case["kind"], "size": case["size"], "decodes": case["decodes"],
        "tokens": sum(t["query_lens"]), "kv_tokens": sum(t["context_lens"]),
        "iter_ms": t["iter_s"] * 1e3, "forward_ms": t["fwd_s"] * 1e3,
        "prepare_ms": t["prep_s"] * 1e3, "floor_ms": f.seconds * 1e3, "bound": f.bound,
        "ratio": ratio, "GBps": f.bytes / t["iter_s"] / 1e9,
        "GFLOPs": f.flops / t["iter_s"] / 1e9, "ceil_GBps": copy_gbps,
        "ceil_GFLOPs": matmul_gflops, "target": target if target is not None else math.nan,
        "met": (ratio <= target) if target is not None else None,
    }


def report(args, table: pd.DataFrame) -> Report:
    args.batches.close()
    # Their values are the table's ceil_* columns, per case.
    setup = {k: v for k, v in asdict(args.before).items()
             if k not in ("copy_gbps", "matmul_gflops")}
    head = [(f"# model {args.model} | dtype {args.dtype} | cpu_linear {args.cpu_linear} "
            f"({args.llm.cpu_gemm}) | decode context {args.decode_context} | layout "
            f"{args.layout} | reps {args.reps} | clock {args.clock} | copy "
            f"{_span(table['ceil_GBps'])} GB/s"
            f" | matmul {_span(table['ceil_GFLOPs'])} GFLOP/s (per case, the higher of before "
            f"and after) | {load.contention(args.load)}")]
    return Report(head, "Iteration time vs roofline floor (ratio = iter_ms / floor_ms)",
                  {"ceilings": setup, "model": args.model, "dtype": args.dtype,
                   "cpu_linear": args.cpu_linear, "cpu_gemm": args.llm.cpu_gemm,
                   "decode_context": args.decode_context, "layout": args.layout})


def _span(values: pd.Series) -> str:
    low, high = values.min(), values.max()
    return f"{low:.1f}" if math.isclose(low, high, rel_tol=5e-4) else f"{low:.1f}-{high:.1f}"


def knobs(p) -> None:
    p.add_argument("--model", default="cpu-small")
    p.add_argument("--decode-batches", type=positive_ints, default=[1, 8, 32])
    p.add_argument("--decode-context", type=positive_int, default=512,
                   help="context tokens of every decode")
    p.add_argument("--prefill-chunks", type=positive_ints, default=[128, 256, 512])
    p.add_argument("--hybrid", type=hybrid_pairs, default=[(256, 8), (512, 8)],
                   help="prefill chunk + decodes, e.g. 256+8 (the chunk is its prompt's second)")
    p.add_argument("--layout", choices=LAYOUTS[1:], default="served",
                   help="where the requests' KV blocks lie in the cache (see "
                        "sarathi_lab.measure.profiling.batches)")
    p.add_argument("--reps", type=positive_int, default=5,
                   help="timed repetitions; medians are reported")
    p.add_argument("--seed", type=int, default=0)


def check(args) -> str | None:
    if not (args.decode_batches or args.prefill_chunks or args.hybrid):
        return ("--decode-batches, --prefill-chunks and --hybrid are all empty: give at least one "
                "case")


CASE = Case(name="iteration",
            reference="floor: the roofline floor at this machine's measured ceilings (ratio)",
            grid=cases, measure=measure, report=report, knobs=knobs, start=start, check=check,
            smoke={"model": "tiny", "reps": 2, "decode_batches": [1, 4], "decode_context": 64,
                       "prefill_chunks": [32, 64], "hybrid": [(32, 4)]},
            shared=SHARED, float_format="{:.2f}")
main = CASE.run
