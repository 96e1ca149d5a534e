"""How much attention time chunked prefill adds by re-reading the KV cache: one layer's attention
for a prompt prefilled chunked and whole, and the KV bytes each reads (docs/benchmarks.md)."""
from __future__ import annotations

import torch

from sarathi_lab import host_load as load
from sarathi_lab.measure.bench.args import bench_parser, positive_int, positive_ints
from sarathi_lab.measure.bench.common import add_common_args, parse, print_table
from sarathi_lab.measure.profiling.attention import (
    LLAMA_HEAD_DIM,
    LLAMA_HEADS,
    LLAMA_KV_HEADS,
    measure_reread,
)
from sarathi_lab.measure.profiling.ceilings import copy_bandwidth_gbps
from sarathi_lab.measure.profiling.machine import describe_machine


def main(argv: list[str] | None = None):
    parser = bench_parser(__spec__, __doc__)
    parser.add_argument("--seq-lens", type=positive_ints, default=[1024, 2048, 4096],
                        help="prompt lengths L, comma list")
    parser.add_argument("--chunks", type=positive_ints, default=[128, 256, 512, 1024],
                        help="chunk sizes C, comma list")
    parser.add_argument("--attention", choices=["auto", "torch", "triton"], default="auto",
                        help="auto: triton on CUDA, torch elsewhere")
    parser.add_argument("--heads", type=positive_int, default=LLAMA_HEADS)
    parser.add_argument("--kv-heads", type=positive_int, default=LLAMA_KV_HEADS)
    parser.add_argument("--head-dim", type=positive_int, default=LLAMA_HEAD_DIM)
    parser.add_argument("--block-size", type=positive_int, default=16)
    parser.add_argument("--reps", type=positive_int, default=5,
                        help="timed repetitions (medians are reported)")
    add_common_args(parser)
    args = parse(parser, argv, seq_lens=[256, 512], chunks=[64, 128], reps=2)
    if not any(C <= L for L in args.seq_lens for C in args.chunks):
        parser.error(f"--chunks={','.join(map(str, args.chunks))} is invalid: no chunk is <= a "
                     f"prompt length of --seq-lens={','.join(map(str, args.seq_lens))}")
    if args.heads % args.kv_heads:
        parser.error(f"--heads={args.heads} is invalid with --kv-heads={args.kv_heads}: query "
                     f"heads must be a multiple "
                     "of the KV heads")
    if args.attention == "triton" and args.device == "cpu":
        parser.error("--attention=triton is invalid with --device cpu: there Triton runs in its "
                     "interpreter, whose times say nothing; use torch")
    device, dtype = torch.device(args.device), args.torch_dtype
    start = load.snapshot()
    rows = [measure_reread(L, C, num_heads=args.heads, num_kv_heads=args.kv_heads,
                           head_dim=args.head_dim, dtype=dtype, device=device,
                           attention=args.attention, block_size=args.block_size, reps=args.reps)
            for L in args.seq_lens for C in args.chunks if C <= L]
    print(describe_machine(device) + f"\n# {load.contention(start)}")
    if device.type == "cuda":
        copy_gbps = copy_bandwidth_gbps(device)
        print(f"# device copy bandwidth: {copy_gbps:.0f} GB/s")
        for row in rows:
            for kind in ("whole", "chunked"):
                row[f"{kind}_frac_of_copy_bw"] = row[f"{kind}_GBps"] / copy_gbps
    return print_table(rows, args.out, device=args.device)


if __name__ == "__main__":
    main()
