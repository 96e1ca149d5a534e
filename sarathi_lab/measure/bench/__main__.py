"""``python -m sarathi_lab.measure.bench NAME [args]``: run one benchmark; ``all`` runs every one in
turn (``python -m sarathi_lab.measure.bench all --smoke`` is what CI runs). Each also runs on its
own as ``python -m sarathi_lab.measure.bench.NAME``; ``--help`` lists its options. ``python -m
sarathi_lab.measure.bench.as_isa KIND NAME [args]`` runs one as another x86 machine kind (AVX2 only;
AVX-512 without bf16) would."""
from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "ceilings": "copy bandwidth and matmul rate of this machine",
    "iteration": "iteration time vs its roofline floor: decode, prefill and hybrid batches",
    "overhead": "share of iteration time outside the model's forward pass",
    "host_path": "host time per iteration, Llama-2-7B shapes, against the predicted H100 forward "
                 "pass",
    "plan_cost": "host time planning balanced attention work per iteration of a simulated "
                 "LLaMA-13B run, its plan cache's hit rate, against the predicted H100 forward",
    "versus": "throughput vs transformers generate with static left-padded batches",
    "attention_reread": "attention time chunked prefill adds by re-reading the KV cache",
    "sampling": "temperature and top-p sampling: the CPU kernel against its torch path",
    "tp_wire": "a tensor-parallel driver's host time per iteration sending each batch to the other "
               "ranks, and its share of the iteration",
}
# `all` runs these; attention_reread is left to its own entry point.
ALL = ("ceilings", "iteration", "overhead", "versus", "sampling")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("\n".join([__doc__, "", "benchmarks:",
                         *(f"  {n:18s} {what}" for n, what in BENCHMARKS.items()),
                         (f"  {'all':18s} {', '.join(ALL)} in turn, with the arguments given "
                         "(e.g. --smoke)")]))
        return 0
    name, rest = argv[0], argv[1:]
    if name not in (*BENCHMARKS, "all"):
        print(f"error: benchmark {name!r} is invalid: allowed are "
              f"{', '.join([*BENCHMARKS, 'all'])} "
              "(python -m sarathi_lab.measure.bench --help lists them)", file=sys.stderr)
        return 2
    for each in ALL if name == "all" else (name,):
        if name == "all":
            print(f"\n===== {each} =====", flush=True)
        importlib.import_module(f"sarathi_lab.measure.bench.{each}").main(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
