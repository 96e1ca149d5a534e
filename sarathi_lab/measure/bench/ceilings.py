"""The machine's ceilings: copy bandwidth and matmul rate, measured on the running machine
(``sarathi_lab.measure.profiling.ceilings``)."""
from __future__ import annotations

from dataclasses import asdict

from sarathi_lab.measure.bench.args import bench_parser, positive_int
from sarathi_lab.measure.bench.common import add_common_args, parse, print_table
from sarathi_lab.measure.profiling.ceilings import FULL, SMOKE, Ceilings, measure_ceilings
from sarathi_lab.measure.profiling.machine import describe_machine


def main(argv: list[str] | None = None) -> Ceilings:
    parser = bench_parser(__spec__, __doc__)
    add_common_args(parser, clock=True)
    parser.add_argument("--copy-mib", type=positive_int, default=FULL["copy_mib"],
                        help="size of the copied buffer")
    parser.add_argument("--matmul-n", type=positive_int, default=FULL["matmul_n"],
                        help="side of the square matmul")
    parser.add_argument("--reps", type=positive_int, default=FULL["reps"])
    args = parse(parser, argv, **SMOKE)
    ceil = measure_ceilings(args.device, args.torch_dtype, copy_mib=args.copy_mib,
                            matmul_n=args.matmul_n, reps=args.reps, clock=args.clock)
    print(describe_machine(args.device))
    print_table([asdict(ceil)], args.out, device=args.device)
    return ceil


if __name__ == "__main__":
    main()
