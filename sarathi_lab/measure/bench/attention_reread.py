"""How much attention time chunked prefill adds by re-reading the KV cache: one layer's attention
for a prompt prefilled chunked and whole, and the KV bytes each reads (docs/benchmarks.md)."""
from __future__ import annotations

import torch

from sarathi_lab import host_load as load
from sarathi_lab.measure.bench.args import positive_int, positive_ints
from sarathi_lab.measure.bench.case import Case, Report
from sarathi_lab.measure.profiling import attention
from sarathi_lab.measure.profiling.ceilings import copy_bandwidth_gbps


def knobs(p) -> None:
    p.add_argument("--seq-lens", type=positive_ints, default=[1024, 2048, 4096],
                   help="prompt lengths L, comma list")
    p.add_argument("--chunks", type=positive_ints, default=[128, 256, 512, 1024],
                   help="chunk sizes C, comma list")
    p.add_argument("--attention", choices=["auto", "torch", "triton"], default="auto",
                   help="auto: triton on CUDA, torch elsewhere")
    p.add_argument("--heads", type=positive_int, default=attention.LLAMA_HEADS)
    p.add_argument("--kv-heads", type=positive_int, default=attention.LLAMA_KV_HEADS)
    p.add_argument("--head-dim", type=positive_int, default=attention.LLAMA_HEAD_DIM)
    p.add_argument("--block-size", type=positive_int, default=16)
    p.add_argument("--reps", type=positive_int, default=5,
                   help="timed repetitions (medians are reported)")


def check(args) -> str | None:
    if not grid(args):
        return (f"--chunks={','.join(map(str, args.chunks))} is invalid: no chunk is <= a "
                f"prompt length of --seq-lens={','.join(map(str, args.seq_lens))}")
    if args.heads % args.kv_heads:
        return (f"--heads={args.heads} is invalid with --kv-heads={args.kv_heads}: query "
                "heads must be a multiple of the KV heads")
    if args.attention == "triton" and args.device == "cpu":
        return ("--attention=triton is invalid with --device cpu: there Triton runs in its "
                "interpreter, whose times say nothing; use torch")


def grid(args) -> list[tuple[int, int]]:
    return [(L, C) for L in args.seq_lens for C in args.chunks if C <= L]


def measure(args, point: tuple[int, int]) -> dict:
    return attention.measure_reread(*point, num_heads=args.heads, num_kv_heads=args.kv_heads,
                                    head_dim=args.head_dim, dtype=args.torch_dtype,
                                    device=torch.device(args.device), attention=args.attention,
                                    block_size=args.block_size, reps=args.reps)


def report(args, table) -> Report:
    device = torch.device(args.device)
    head = [f"# {load.contention(args.load)}"]
    if device.type == "cuda":
        copy_gbps = copy_bandwidth_gbps(device)
        head.append(f"# device copy bandwidth: {copy_gbps:.0f} GB/s")
        for kind in ("whole", "chunked"):
            table[f"{kind}_frac_of_copy_bw"] = table[f"{kind}_GBps"] / copy_gbps
    return Report(head)


CASE = Case(name="attention_reread",
            reference="peer: the same prompt's attention prefilled whole (time_ratio)",
            grid=grid, measure=measure, report=report, knobs=knobs, check=check,
            smoke={"seq_lens": [256, 512], "chunks": [64, 128], "reps": 2})
main = CASE.run
