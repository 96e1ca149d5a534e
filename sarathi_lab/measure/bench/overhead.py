"""Engine overhead: the share of each iteration spent outside the model's forward pass, split into
the parts the engine records (docs/benchmarks.md). Target: under 5% of iteration time."""
from __future__ import annotations

from sarathi_lab import host_load as load
from sarathi_lab.engine.scheduler import scheduler_names
from sarathi_lab.measure.bench.args import int_range, names_of, positive_int
from sarathi_lab.measure.bench.case import Case, Report
from sarathi_lab.measure.bench.trace import make_workload
from sarathi_lab.measure.profiling.overhead import HOST_PARTS, TARGET, serve


def start(args) -> None:
    from sarathi_lab.model import load_config

    args.prompts, args.new = make_workload(args.requests, args.prompt_len, args.new_tokens,
                                           load_config(args.model).vocab_size, args.seed)


def measure(args, name: str) -> dict:
    """Each part's share of the iterations' time, summed over the run."""
    from sarathi_lab import LLM

    # The workload's longest, not the model's context.
    max_len = max(len(p) + n for p, n in zip(args.prompts, args.new))
    llm = LLM(args.model, scheduler=name, chunk_size=args.chunk_size,
              max_batch_size=args.batch_size, max_model_len=max_len, device=args.device,
              dtype=args.dtype, num_kv_blocks=args.kv_blocks, cpu_linear=args.cpu_linear)
    args.gemm = llm.cpu_gemm
    table = serve(llm, args.prompts, args.new)
    summary = llm.metrics.summary()
    busy, forward = summary["busy_time_s"], table.forward_s.sum()
    parts = {part: table[f"{part}_s"].sum() for part in HOST_PARTS}
    return {
        "scheduler": name, "iterations": len(table), "busy_s": busy, "forward_s": forward,
        "overhead_fraction": summary["overhead_fraction"],
        **{f"{part}_frac": seconds / busy for part, seconds in parts.items()},
        "rest_frac": (busy - forward - sum(parts.values())) / busy,
        "overhead_per_iter_ms": (busy - forward) / len(table) * 1e3,
        "iter_ms_mean": busy / len(table) * 1e3,
        "tokens_per_s": summary["total_throughput_tok_s"],
        "target": TARGET, "met": summary["overhead_fraction"] < TARGET,
    }


def report(args, table) -> Report:
    head = [(f"# model {args.model} | dtype {args.dtype} | cpu_linear {args.cpu_linear} "
            f"({args.gemm}) | {len(args.prompts)} requests, prompts {args.prompt_len},"
            f" new tokens {args.new_tokens} | chunk {args.chunk_size} | batch {args.batch_size}"
            f" | {load.contention(args.load)}")]
    return Report(head, "Share of iteration time outside the forward pass",
                  {"model": args.model, "dtype": args.dtype, "cpu_linear": args.cpu_linear,
                   "cpu_gemm": args.gemm})


def knobs(p) -> None:
    p.add_argument("--model", default="cpu-small")
    p.add_argument("--schedulers", type=names_of(scheduler_names()), default=["sarathi", "vllm"])
    p.add_argument("--chunk-size", type=positive_int, default=512)
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--kv-blocks", type=positive_int, default=None,
                   help="KV cache blocks (default: the engine's)")
    p.add_argument("--requests", type=positive_int, default=16)
    p.add_argument("--prompt-len", type=int_range, default=(128, 512), metavar="LO-HI",
                   help="prompt lengths, uniform in [LO, HI]")
    p.add_argument("--new-tokens", type=int_range, default=(32, 64), metavar="LO-HI",
                   help="tokens generated per request, uniform in [LO, HI] (greedy, EOS ignored)")
    p.add_argument("--seed", type=int, default=0)


CASE = Case(name="overhead",
            reference=f"target: overhead_fraction under {TARGET:.0%} of the iteration",
            grid=lambda args: args.schedulers, measure=measure, report=report,
            knobs=knobs, start=start, shared=("device", "dtype", "threads", "cpu_linear"),
            smoke={"model": "tiny", "requests": 4, "prompt_len": (16, 48), "new_tokens": (4, 8),
                   "chunk_size": 32, "batch_size": 4},
            float_format="{:.4f}")
main = CASE.run
