"""The driver's host cost per iteration of a tensor-parallel engine: packing an iteration's batch
into one buffer and broadcasting it (header, then payload) to the other ranks, beside the iteration
it serves, for decode batches of each size, the hybrid iterations (a prefill chunk with the decodes
riding on it) and the prefill-only first one. Method: docs/parallel.md.

Each request gets as many more tokens as it was prefilled earlier: all finish together."""
from __future__ import annotations

from statistics import median

import numpy as np

from sarathi_lab.measure.bench.args import positive_int, positive_ints
from sarathi_lab.measure.bench.case import Case, Report

KINDS = ("decode", "hybrid", "prefill")


def knobs(p) -> None:
    p.add_argument("--model", default="tiny")
    p.add_argument("--tensor-parallel", type=positive_int, default=2)
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="default: float32 on a CPU, bfloat16 on GPUs")
    p.add_argument("--requests", type=positive_ints, default=[32, 128],
                   help="decode batch sizes")
    p.add_argument("--new-tokens", type=positive_int, default=32,
                   help="decode-only iterations at each size")
    p.add_argument("--prompt", type=positive_int, default=64,
                   help="prompt tokens per request (one chunk)")
    # cuda: rank i on GPU i, NCCL for the forward's collectives
    p.set_defaults(device="cpu")


def start(args) -> None:
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")


def measure(args, n: int) -> list[dict]:
    from sarathi_lab import LLM, SamplingParams
    from sarathi_lab.engine.metrics import iteration_kinds

    llm = LLM(args.model, tensor_parallel=args.tensor_parallel, device=args.device,
              dtype=args.dtype, max_batch_size=n, chunk_size=max(args.prompt, 16), warmup_iters=2)
    llm.generate([[1] * args.prompt] * n, [n - i + args.new_tokens for i in range(n)],
                 sampling=SamplingParams(ignore_eos=True))
    metrics, its = llm.metrics, llm.metrics.iterations
    kinds = iteration_kinds([it.num_prefill_tokens for it in its],
                            [it.num_decode_tokens for it in its])
    rows = []
    for kind in KINDS:
        picked = np.flatnonzero(kinds == kind)
        if not len(picked):
            continue
        sends = [metrics.broadcast_s[i] for i in picked]
        durations = [its[i].duration for i in picked]
        rows.append({"requests": n, "kind": kind, "iterations": len(picked),
                     "decodes_p50": median(its[i].num_decode_requests for i in picked),
                     "payload_bytes": int(median(metrics.broadcast_bytes[i] for i in picked)),
                     "broadcast_ms_p50": 1e3 * median(sends),
                     "broadcast_ms_max": 1e3 * max(sends),
                     "prepare_ms_p50": 1e3 * median(its[i].prepare_time for i in picked),
                     "iteration_ms_p50": 1e3 * median(durations),
                     # What the driver's send costs the engine's throughput at this batch.
                     "broadcast_share_p50": median(s / d for s, d in zip(sends, durations))})
    return rows


CASE = Case(name="tp_wire",
            reference="peer: the iteration the broadcast serves (broadcast_share_p50)",
            grid=lambda args: args.requests, measure=measure, knobs=knobs, start=start,
            shared=("device",),
            report=lambda args, table: Report([], (
                f"{args.model}, tensor_parallel={args.tensor_parallel} on {args.device} "
                f"({args.dtype}): the driver's broadcast per iteration (prepare includes it)")),
            smoke={"requests": [4], "new_tokens": 4, "prompt": 16}, machine=False)
main = CASE.run
