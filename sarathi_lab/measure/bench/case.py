"""A measurement as a case: a grid of points, a callable measuring one point into rows, and the
reference its rows are read against. One runner parses the shared options once, runs the grid on
this machine's device (or ``--dry``: the smoke grid on the CPU) and writes the table."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sarathi_lab import cli_args, output_files, provenance
from sarathi_lab.measure.bench.args import bench_parser, table_path, thread_count

# `all` runs these; attention_reread and the others are left to their own names (every case is
# registered in measure/commands.py, the CASE of the bench module so named).
ALL = ("ceilings", "iteration", "overhead", "versus", "sampling")
# The options a case may share with the others, parsed here and nowhere else.
SHARED = ("device", "dtype", "threads", "clock", "cpu_linear")


@dataclass(frozen=True)
class Report:
    """Printed around a case's table once every point is measured."""
    head: list[str]
    title: str | None = None
    extra: dict = field(default_factory=dict)
    tail: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Case:
    """``grid(args)`` the points; ``measure(args, point)`` one point's rows; ``start(args)`` adds to
    the options, once, what the points share (a model, a workload)."""
    name: str  # its module's: whose docstring's first paragraph says what it measures
    reference: str  # what its rows are read against: a peer, a floor, a target, or none
    grid: Callable[[argparse.Namespace], Sequence]
    measure: Callable[[argparse.Namespace, Any], dict | list[dict]]
    report: Callable[[argparse.Namespace, Any], Report] = lambda args, table: Report([])
    knobs: Callable[[argparse.ArgumentParser], None] = lambda parser: None
    smoke: dict = field(default_factory=dict)  # tiny sizes for --smoke and --dry
    shared: tuple[str, ...] = ("device", "dtype", "threads")
    start: Callable[[argparse.Namespace], None] = lambda args: None
    check: Callable[[argparse.Namespace], str | None] = lambda args: None  # a refusal, or None
    float_format: str = "{:.3f}"
    machine: bool = True

    @property
    def doc(self) -> str:
        return sys.modules[f"{__package__}.{self.name}"].__doc__

    @property
    def what(self) -> str:
        return " ".join(self.doc.split("\n\n")[0].split())

    def run(self, argv: list[str] | None = None):
        """The grid measured point by point, the table printed and (--out) written."""
        import pandas as pd

        from sarathi_lab import host_load
        from sarathi_lab.measure.profiling.machine import describe_machine

        p = parser(self)
        args = parse(self, p, argv)
        out = None
        if args.out:
            out = table_outputs(self.name, args)
            try:
                out.check()
            except output_files.OutputRefused as e:
                p.error(str(e))
        args.load = host_load.snapshot()
        self.start(args)
        rows = []
        for point in self.grid(args):
            got = self.measure(args, point)
            rows += [got] if isinstance(got, dict) else got
        table = pd.DataFrame(rows)
        report, device = self.report(args, table), getattr(args, "device", "cpu")
        head = [describe_machine(device)] * self.machine + report.head
        print("\n".join([*head, *([f"\n## {report.title}"] if report.title else [])]))
        with pd.option_context("display.width", 200, "display.max_columns", 50):
            print(table.to_string(index=False, float_format=self.float_format.format))
        if out is not None:
            try:
                write_table(table, out, report.extra, device)
            except output_files.OutputRefused as e:
                p.error(str(e))
        if report.tail:
            print("\n".join(report.tail))
        return table


def device_arg(text: str) -> str:
    """Refused at parsing rather than after work started."""
    import torch

    if text not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: must be cpu or cuda")
    if text == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError("'cuda' is invalid: no CUDA device is available here; "
                                         "allowed: cpu")
    return text


def parser(case: Case) -> argparse.ArgumentParser:
    from sarathi_lab.config import CPU_LINEARS, DTYPES
    from sarathi_lab.engine.timer import CLOCKS
    from sarathi_lab.host_features import resolve_device
    from sarathi_lab.measure.profiling import isa

    p = bench_parser(case.name, case.doc)
    shared = {
        "device": {"type": device_arg, "default": resolve_device("auto")},
        "dtype": {"choices": ["auto", *DTYPES], "default": "auto",
                  "help": "auto: bfloat16 on CUDA or on a CPU with bf16 units, else float32"},
        "cpu_linear": {"choices": CPU_LINEARS, "default": "auto",
                       "help": "the engine's CPU linear layers over packed weights, or F.linear "
                               "(aten); docs/cpu_engine.md"},
        "threads": {"type": thread_count, "default": None,
                    "help": "torch threads (default: every core the process may use)"},
        "clock": {"choices": CLOCKS, "default": "wall",
                  "help": "cpu: the process's CPU time, for a machine shared with other jobs "
                          "(with --threads 1)"}}
    for name in (n for n in SHARED if n in case.shared):
        p.add_argument(f"--{name.replace('_', '-')}", **shared[name])
    case.knobs(p)  # after the shared ones: a case may set their defaults
    cli_args.shared(p, smoke="tiny sizes that finish in seconds (CI); options given on the "
                    "command line keep their value",
                    out="also write the table to this file (.csv or .json)", out_type=table_path,
                    force="replace an --out file another benchmark, device or scale wrote")
    p.add_argument("--dry", action="store_true",
                   help="--smoke on the CPU with one thread, wherever the case has those options")
    p.add_argument("--isa", choices=isa.KINDS, help="run as this x86 machine kind would, on this "
                   "CPU (docs/benchmarks.md); the machine's line names it")
    return p


def parse(case: Case, p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """--threads and --dtype resolved and written back: the tables' labels."""
    import torch

    from sarathi_lab.host_features import run_dtype, usable_cores
    from sarathi_lab.plan import torch_run_dtype

    argv = list(sys.argv[1:] if argv is None else argv)
    args, unknown = p.parse_known_args(argv)
    if unknown:
        allowed = [o for a in p._actions for o in a.option_strings if o.startswith("--")]
        p.error(f"{unknown[0]} is not an option of {case.name}: allowed are {', '.join(allowed)}")
    if args.smoke or args.dry:
        dry = {"device": "cpu", "threads": 1} if args.dry else {}
        p.set_defaults(smoke=True, **case.smoke, **{k: v for k, v in dry.items()
                                                    if k in case.shared})
        args = p.parse_args(argv)
    if args.isa:
        as_isa(case, p, args.isa, argv)
    # CPU time is a core's own only on the CPU with one thread (a GPU's is not; threads add up).
    has = set(case.shared)
    if "clock" in has and args.clock == "cpu" and args.device == "cuda":
        p.error("--clock cpu is invalid with --device cuda: it counts this process's CPU "
                "time, not the GPU's; use --clock wall")
    if "clock" in has and args.clock == "cpu" and (args.threads or usable_cores()) != 1:
        given = f"{args.threads or usable_cores()}" + ("" if args.threads
                                                       else " (the default: every core)")
        p.error(f"--clock cpu is invalid with --threads {given}: CPU time is one "
                "core's time only with one thread (the others' seconds, spin-waits too, add "
                "up); use --threads 1")
    if "threads" in has:
        args.threads = args.threads or usable_cores()
        torch.set_num_threads(args.threads)
    if "dtype" in has:
        # auto: the dtype the engine itself runs when asked for bfloat16
        dtype = run_dtype("bfloat16", args.device) if args.dtype == "auto" else args.dtype
        if "model" in args:  # bfloat16 without bf16 units runs float32
            dtype = str(torch_run_dtype(dtype, args.device))
        args.dtype = dtype.removeprefix("torch.")
        args.torch_dtype = getattr(torch, args.dtype)
    if refused := case.check(args):
        p.error(refused)
    return args


def as_isa(case: Case, p: argparse.ArgumentParser, name: str, argv: list[str]) -> None:
    """The environment set, the case rerun in a fresh interpreter: libraries read ISA at load."""
    from sarathi_lab.measure.profiling import isa
    from sarathi_lab.measure.profiling.machine import cpu_flags

    if os.environ.get(isa.ENV) == name:
        return isa.apply()
    if missing := sorted(isa.KINDS[name].needs - cpu_flags()):
        p.error(f"--isa={name} is invalid here: this CPU lacks {', '.join(missing)}")
    os.execve(sys.executable, [sys.executable, "-m", "sarathi_lab.measure", case.name, *argv],
              os.environ | isa.KINDS[name].environment(name))


def table_outputs(name: str, args: argparse.Namespace) -> output_files.Outputs:
    """--out's file, of this benchmark at this device and scale: another's is replaced only with
    --force."""
    path = Path(args.out)
    device = getattr(args, "device", "cpu")
    made = provenance.Provenance(f"measured {'GPU' if device == 'cuda' else 'CPU'}: {name}",
                                 "smoke" if args.smoke else "",
                                 writer=f"python -m sarathi_lab.measure {name}")
    return output_files.Outputs(path.parent, {path.name: made}, given=f"--out={args.out}",
                                force=args.force, how="--force replaces it; --out FILE writes "
                                "elsewhere")


def write_table(table, out: output_files.Outputs, extra: dict | None = None,
                device: str = "cpu") -> None:
    """``device``: the one the JSON's machine record names."""
    from sarathi_lab.measure.profiling.machine import machine_record

    (name,) = out.names
    if name.endswith(".json"):
        out.add(name, json.dumps({"machine": machine_record(device), **(extra or {}),
                                  "rows": table.to_dict(orient="records")}, indent=1,
                                 default=str))
    else:
        out.add(name, table.to_csv(index=False))
    out.write()


def named(name: str) -> Case:
    return importlib.import_module(f"{__package__}.{name}").CASE

