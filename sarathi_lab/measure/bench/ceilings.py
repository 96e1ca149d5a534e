"""The machine's ceilings: copy bandwidth and matmul rate, measured on the running machine
(``sarathi_lab.measure.profiling.ceilings``)."""
from __future__ import annotations

from dataclasses import asdict

from sarathi_lab.measure.bench.args import positive_int
from sarathi_lab.measure.bench.case import Case
from sarathi_lab.measure.profiling.ceilings import FULL, SMOKE, measure_ceilings


def knobs(p) -> None:
    p.add_argument("--copy-mib", type=positive_int, default=FULL["copy_mib"],
                   help="size of the copied buffer")
    p.add_argument("--matmul-n", type=positive_int, default=FULL["matmul_n"],
                   help="side of the square matmul")
    p.add_argument("--reps", type=positive_int, default=FULL["reps"])


def measure(args, point: None) -> dict:
    return asdict(measure_ceilings(args.device, args.torch_dtype, copy_mib=args.copy_mib,
                                   matmul_n=args.matmul_n, reps=args.reps, clock=args.clock))


CASE = Case(name="ceilings",
            reference="none: they are the floors the other cases are held to",
            grid=lambda args: [None], measure=measure, knobs=knobs, smoke=SMOKE,
            shared=("device", "dtype", "threads", "clock"))
main = CASE.run
