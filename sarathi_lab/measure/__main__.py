"""``python -m sarathi_lab.measure``: every measurement the wing registers, a line each;
``python -m sarathi_lab.measure NAME [args]`` runs a benchmark or a simulator check by its name
(``all --smoke``: the benchmarks CI runs, in turn; ``NAME --help``: a benchmark's options). The
GPU suite runs as ``python -m sarathi_lab.measure.gpu``, a task as ``python -m sarathi_lab.run
task=NAME``."""
from __future__ import annotations

import ast
import importlib
import signal
import sys
import textwrap
from pathlib import Path

from sarathi_lab import output_files
from sarathi_lab.harness.interrupts import Interrupted, signals_interrupt
from sarathi_lab.harness.tasks import task_names
from sarathi_lab.measure import bench, sim_check, tasks
from sarathi_lab.measure.bench.case import ALL, NAMES, named
from sarathi_lab.measure.gpu.plan import STEPS

WIDTH = 100


def _line(name: str, what: str) -> str:
    name = f"  {name:18s} "
    return name + textwrap.shorten(what, max(WIDTH - len(name), 20), placeholder=" ...")


def _doc_line(package, name: str) -> str:
    """From the module's docstring, read without importing it (a task may load torch)."""
    source = (Path(package.__file__).parent / f"{name}.py").read_text()
    return _line(name, " ".join((ast.get_docstring(ast.parse(source)) or "").split()))


def listing() -> str:
    return "\n".join([
        __doc__, "", "benchmarks (python -m sarathi_lab.measure NAME):",
        *(_doc_line(bench, n) for n in NAMES),
        _line("all", f"{', '.join(ALL)} in turn, with the arguments given (e.g. --smoke)"),
        "", "simulator checks (python -m sarathi_lab.measure NAME):",
        *(_doc_line(sim_check, n) for n in sim_check.CHECKS),
        "", "GPU suite steps (python -m sarathi_lab.measure.gpu --steps NAME):",
        *(_line(s.name, s.what) for s in STEPS),
        "", "tasks (python -m sarathi_lab.run task=NAME):",
        *(_doc_line(tasks, n) for n in task_names())])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(listing())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in (*NAMES, "all", *sim_check.CHECKS):
        print(f"error: measurement {name!r} is invalid: allowed are "
              f"{', '.join([*NAMES, 'all', *sim_check.CHECKS])} "
              "(python -m sarathi_lab.measure lists them)", file=sys.stderr)
        return 2
    try:
        with output_files.one_call(), signals_interrupt(signal.SIGINT, signal.SIGTERM):
            if name in sim_check.CHECKS:
                importlib.import_module(f"sarathi_lab.measure.sim_check.{name}").main(rest)
            elif name != "all":
                named(name).run(rest)
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
