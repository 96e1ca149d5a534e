"""The driver's host cost per iteration of a tensor-parallel engine: packing an iteration's batch into
one buffer and broadcasting it (header, then payload) to the other ranks, beside building the batch's
tensors, for decode batches of each size and one chunked-prefill batch. Method: docs/parallel.md."""
from __future__ import annotations

import statistics

import pandas as pd

from sarathi_lab.bench.args import bench_parser, positive_int, positive_ints
from sarathi_lab.bench.common import print_table


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = bench_parser(__spec__, __doc__)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--tensor-parallel", type=positive_int, default=2)
    parser.add_argument("--requests", type=positive_ints, default=[1, 8, 32], help="decode batch sizes")
    parser.add_argument("--new-tokens", type=positive_int, default=32)
    parser.add_argument("--prompt", type=positive_int, default=64, help="prompt tokens per request")
    args = parser.parse_args(argv)
    from sarathi_lab import LLM, SamplingParams

    rows = []
    for n in args.requests:
        llm = LLM(args.model, tensor_parallel=args.tensor_parallel, device="cpu", max_batch_size=n,
                  chunk_size=max(args.prompt, 16), warmup_iters=2)
        executor = llm.engine.executor
        executor.broadcast_s.clear()
        executor.broadcast_bytes.clear()
        llm.generate([[1] * args.prompt] * n, args.new_tokens, sampling=SamplingParams(ignore_eos=True))
        decode = [i for i, it in enumerate(llm.metrics.iterations) if it.num_prefill_tokens == 0]
        prefill = [i for i, it in enumerate(llm.metrics.iterations) if it.num_prefill_tokens > 0]
        for kind, picked in (("decode", decode), ("prefill", prefill)):
            if not picked:
                continue
            sends = [executor.broadcast_s[i] for i in picked]
            rows.append({"requests": n, "kind": kind, "iterations": len(picked),
                         "payload_bytes": int(statistics.median(executor.broadcast_bytes[i] for i in picked)),
                         "broadcast_ms_p50": 1e3 * statistics.median(sends),
                         "broadcast_ms_max": 1e3 * max(sends),
                         "prepare_ms_p50": 1e3 * statistics.median(llm.metrics.iterations[i].prepare_time
                                                                   for i in picked),
                         "iteration_ms_p50": 1e3 * statistics.median(llm.metrics.iterations[i].duration
                                                                     for i in picked)})
    return print_table(rows, title=f"tensor_parallel={args.tensor_parallel}: the driver's broadcast per iteration "
                            "(prepare includes it)")


if __name__ == "__main__":
    main()
