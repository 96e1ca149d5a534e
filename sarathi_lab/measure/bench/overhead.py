"""Engine overhead: the share of each iteration spent outside the model's forward pass, split into
the parts the engine records (docs/benchmarks.md). Target: under 5% of iteration time."""
from __future__ import annotations

import pandas as pd

from sarathi_lab import host_load as load
from sarathi_lab.engine.scheduler import scheduler_names
from sarathi_lab.measure.bench.args import bench_parser, int_range, names_of, positive_int
from sarathi_lab.measure.bench.common import add_common_args, make_workload, parse, print_table
from sarathi_lab.measure.profiling.machine import describe_machine
from sarathi_lab.measure.profiling.overhead import HOST_PARTS, TARGET, serve


def measure(llm, prompts, new_tokens) -> dict:
    """Each part's share of the iterations' time, summed over the run."""
    table = serve(llm, prompts, new_tokens)
    summary = llm.metrics.summary()
    busy, forward = summary["busy_time_s"], table.forward_s.sum()
    parts = {part: table[f"{part}_s"].sum() for part in HOST_PARTS}
    return {
        "iterations": len(table), "busy_s": busy, "forward_s": forward,
        "overhead_fraction": summary["overhead_fraction"],
        **{f"{part}_frac": seconds / busy for part, seconds in parts.items()},
        "rest_frac": (busy - forward - sum(parts.values())) / busy,
        "overhead_per_iter_ms": (busy - forward) / len(table) * 1e3,
        "iter_ms_mean": busy / len(table) * 1e3,
        "tokens_per_s": summary["total_throughput_tok_s"],
    }


def run(args) -> pd.DataFrame:
    from sarathi_lab import LLM
    from sarathi_lab.model import load_config

    start = load.snapshot()
    prompts, new_tokens = make_workload(args.requests, args.prompt_len, args.new_tokens,
                                        load_config(args.model).vocab_size, args.seed)
    # The workload's longest, not the model's context.
    max_len = max(len(p) + n for p, n in zip(prompts, new_tokens))
    rows = []
    for name in args.schedulers:
        llm = LLM(args.model, scheduler=name, chunk_size=args.chunk_size,
                  max_batch_size=args.batch_size, max_model_len=max_len, device=args.device,
                  dtype=args.dtype, num_kv_blocks=args.kv_blocks, cpu_linear=args.cpu_linear)
        gemm = llm.cpu_gemm
        row = {"scheduler": name} | measure(llm, prompts, new_tokens)
        row["target"], row["met"] = TARGET, row["overhead_fraction"] < TARGET
        rows.append(row)
        del llm
    print(describe_machine(args.device))
    print(f"# model {args.model} | dtype {args.dtype} | cpu_linear {args.cpu_linear} ({gemm})"
          f" | {len(prompts)} requests, prompts {args.prompt_len},"
          f" new tokens {args.new_tokens} | chunk {args.chunk_size} | batch {args.batch_size}"
          f" | {load.contention(start)}")
    extra = {"model": args.model, "dtype": args.dtype, "cpu_linear": args.cpu_linear,
             "cpu_gemm": gemm}
    title = "Share of iteration time outside the forward pass"
    return print_table(rows, args.out, title, "{:.4f}", args.device, extra)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    p = bench_parser(__spec__, __doc__)
    add_common_args(p, engine=True)
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
    return run(parse(p, argv, model="tiny", requests=4, prompt_len=(16, 48), new_tokens=(4, 8),
                     chunk_size=32, batch_size=4))


if __name__ == "__main__":
    main()
