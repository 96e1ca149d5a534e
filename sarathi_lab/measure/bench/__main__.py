"""``python -m sarathi_lab.measure.bench NAME [args]``: run one case; ``all`` runs the ones CI runs
in turn (``all --smoke``); ``NAME --help`` lists a case's options."""
from __future__ import annotations

import sys

from sarathi_lab.measure.bench.case import ALL, NAMES, named, what


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("\n".join([__doc__, "", "benchmarks:", *(f"  {n:18s} {what(n)}" for n in NAMES),
                         (f"  {'all':18s} {', '.join(ALL)} in turn, with the arguments given "
                         "(e.g. --smoke)")]))
        return 0
    name, rest = argv[0], argv[1:]
    if name not in (*NAMES, "all"):
        print(f"error: benchmark {name!r} is invalid: allowed are {', '.join([*NAMES, 'all'])} "
              "(python -m sarathi_lab.measure lists them)", file=sys.stderr)
        return 2
    for each in ALL if name == "all" else (name,):
        if name == "all":
            print(f"\n===== {each} =====", flush=True)
        named(each).run(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
