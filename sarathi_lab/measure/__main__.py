"""``python -m sarathi_lab.measure``: every command it runs, a line each, by group;
``python -m sarathi_lab.measure NAME [args]`` runs one by its name (commands.py: a benchmark, a
simulator check, a GPU suite command, an analysis of result files; ``all --smoke``: the benchmarks
CI runs, in turn; ``NAME --help``: a command's options). A run or sweep is ``python -m
sarathi_lab.run``, a task ``python -m sarathi_lab.run task=NAME``."""
from __future__ import annotations

import ast
import signal
import sys
import textwrap
from pathlib import Path

from sarathi_lab import output_files
from sarathi_lab.measure.commands import COMMANDS, GROUPS, group_of, load, module_file

WIDTH = 100
MEASURE = "python -m sarathi_lab.measure"


def _line(name: str, what: str) -> str:
    name = f"  {name:18s} "
    return name + textwrap.shorten(what, max(WIDTH - len(name), 20), placeholder=" ...")


def _doc_line(name: str, path: Path) -> str:
    """From the module's docstring, read without importing it (a command may load torch)."""
    return _line(name, " ".join((ast.get_docstring(ast.parse(path.read_text())) or "").split()))


def listing() -> str:
    from sarathi_lab.harness.tasks import task_names
    from sarathi_lab.measure import tasks
    from sarathi_lab.measure.bench.case import ALL
    from sarathi_lab.measure.gpu.plan import STEPS

    lines = [__doc__]
    for group in GROUPS:
        lines += ["", f"{group.title} ({MEASURE} NAME):",
                  *(_doc_line(n, module_file(n)) for n in group.commands)]
        if group.title == "benchmarks":
            lines.append(_line("all", f"{', '.join(ALL)} in turn, with the arguments given "
                                      "(e.g. --smoke)"))
    folder = Path(tasks.__file__).parent
    return "\n".join([*lines, "", f"GPU suite steps ({MEASURE} gpu --steps NAME):",
                      *(_line(s.name, s.what) for s in STEPS),
                      "", "tasks (python -m sarathi_lab.run task=NAME):",
                      *(_doc_line(n, folder / f"{n}.py") for n in task_names())])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(listing())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in (*COMMANDS, "all"):
        print(f"error: measurement {name!r} is invalid: allowed are "
              f"{', '.join([*COMMANDS, 'all'])} ({MEASURE} lists them)", file=sys.stderr)
        return 2
    if name != "all" and not group_of(name).interruptible:
        code = load(name)(rest)
        return code if isinstance(code, int) else 0  # not a table a caller reads
    return interruptible(name, rest)


def interruptible(name: str, rest: list[str]) -> int:
    from sarathi_lab.harness.interrupts import Interrupted, signals_interrupt
    from sarathi_lab.measure.bench.case import ALL, named

    try:
        with output_files.one_call(), signals_interrupt(signal.SIGINT, signal.SIGTERM):
            if name != "all":
                load(name)(rest)
            for each in ALL if name == "all" else ():
                print(f"\n===== {each} =====", flush=True)
                named(each).run(own_out(rest, each))
    except Interrupted as e:
        # A measurement writes its tables at its end, all at once: nothing of this one is.
        print(f"interrupted ({e}): {name} stopped and the processes it started with it; its "
              "tables are not written; the same command starts it over", file=sys.stderr)
        return e.exit_code
    return 0


def own_out(argv: list[str], name: str) -> list[str]:
    """``all --out t.csv``: each benchmark's table its own file, t.<name>.csv."""
    found = []
    for i, arg in enumerate(argv):
        given = argv[i + 1] if arg == "--out" and i + 1 < len(argv) else (
            arg.removeprefix("--out=") if arg.startswith("--out=") else None)
        if given is not None:
            path = Path(given)
            found.append((i, str(path.with_name(f"{path.stem}.{name}{path.suffix}"))))
    argv = list(argv)
    for i, path in found:
        argv[i + (argv[i] == "--out")] = path if argv[i] == "--out" else f"--out={path}"
    return argv


if __name__ == "__main__":
    sys.exit(main())
