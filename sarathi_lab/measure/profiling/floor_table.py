"""The launch step's iterations against their two floors, by arithmetic alone, at a device's
measured ceilings: what a prediction of ``engine_over_floor`` and ``engine_over_sequential_floor``
is set beside."""
from __future__ import annotations

from pathlib import Path

from sarathi_lab import cli_args
from sarathi_lab.analysis import gpu_records
from sarathi_lab.analysis.launch_grid import MORE_CONTEXTS, SHAPES, label
from sarathi_lab.config import DTYPE_BYTES
from sarathi_lab.model import load_config
from sarathi_lab.model.floors import floor, memory_ceiling, sequential_floor
from sarathi_lab.model.shape import Shape


def rows(memory_gbps: float, matmul_tflops: float, device: str = "cuda") -> list[dict]:
    """Every case at every context."""
    model, dtype, context, _, cases = SHAPES[device]
    shape, elem = Shape.of(load_config(model)), DTYPE_BYTES[dtype]
    found = []
    for at in (context, *MORE_CONTEXTS[device]):
        for chunk, decodes in cases:
            queries = [chunk] * (chunk > 0) + [1] * decodes
            args = (shape, queries, [at] * len(queries), len(queries), elem, memory_gbps,
                    matmul_tflops * 1e3)
            physical, sequential = floor(*args), sequential_floor(*args)
            found.append({"iteration": label(chunk, decodes, None if at == context else at),
                          "compute_ms": physical.compute_s * 1e3,
                          "memory_ms": physical.memory_s * 1e3, "floor_ms": physical.seconds * 1e3,
                          "sequential_floor_ms": sequential.seconds * 1e3,
                          "sequential_over_floor": sequential.seconds / physical.seconds})
    return found


def markdown(found: list[dict]) -> str:
    head = ("| iteration | compute ms | memory ms | floor ms | sequential floor ms | "
            "sequential / floor |")
    lines = [head, "|---|---|---|---|---|---|"]
    lines += [f"| {r['iteration']} | {r['compute_ms']:.2f} | {r['memory_ms']:.2f} | "
              f"{r['floor_ms']:.2f} | {r['sequential_floor_ms']:.2f} | "
              f"{r['sequential_over_floor']:.2f} |" for r in found]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = cli_args.Parser(prog="python -m sarathi_lab.measure floor_table",
                             description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", type=Path, required=True,
                        help="an env step's env.json (read_gbps or copy_gbps, matmul_tflops)")
    args = parser.parse_args(argv)
    if args.env.name != gpu_records.ENV_FILE:
        parser.error(f"--env={args.env} is invalid: must be an env step's "
                     f"{gpu_records.ENV_FILE}")
    try:
        env = gpu_records.read_env(args.env.parent)
    except gpu_records.RecordError as e:
        parser.error(str(e))
    (gbps, which), tflops = memory_ceiling(env), float(env["matmul_tflops"])
    print(f"{env.get('device', '?')}: {which} {gbps:.0f} GB/s, bf16 matmul {tflops:.0f} TFLOP/s\n")
    print(markdown(rows(gbps, tflops)))
    return 0
