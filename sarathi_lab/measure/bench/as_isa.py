"""``python -m sarathi_lab.measure.bench.as_isa KIND BENCHMARK [args]``: run one benchmark as
another x86 machine kind would run it, on this CPU (docs/benchmarks.md); the tables' machine line
says which kind it was. The environment is set, then this module starts again in a fresh
interpreter: the libraries read their ISA settings when they load.

    python -m sarathi_lab.measure.bench.as_isa avx2 iteration --dtype float32
"""
from __future__ import annotations

import os
import sys

from sarathi_lab.measure.bench.case import NAMES, named
from sarathi_lab.measure.profiling import isa
from sarathi_lab.measure.profiling.machine import cpu_flags


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or argv[0] in ("-h", "--help"):
        kinds = "\n".join(f"  {name:12s} {kind.what}" for name, kind in isa.KINDS.items())
        print(f"{__doc__}\nkinds:\n{kinds}\nbenchmarks: {', '.join(NAMES)}")
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    name, bench, rest = argv[0], argv[1], argv[2:]
    for key, value, allowed in (("KIND", name, isa.KINDS), ("BENCHMARK", bench, NAMES)):
        if value not in allowed:
            print(f"as_isa: {key}={value!r} is not one of {sorted(allowed)}", file=sys.stderr)
            return 2
    kind = isa.KINDS[name]
    if os.environ.get(isa.ENV) != name:
        missing = sorted(kind.needs - cpu_flags())
        if missing:
            print(f"as_isa: this CPU cannot run the {name} kind's code (it lacks "
                  f"{', '.join(missing)})", file=sys.stderr)
            return 2
        os.execve(sys.executable, [sys.executable, "-m", __spec__.name, *argv],
                  os.environ | kind.environment(name))
    isa.apply()
    named(bench).run(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
