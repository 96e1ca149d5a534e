"""What the benchmarks' command lines share: arguments, threads, tables. What they measure with
lives in ``sarathi_lab.profiling``."""
from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import pandas as pd
import torch

from sarathi_lab.bench.args import table_path, thread_count
from sarathi_lab.config import CPU_LINEARS, DTYPES, EngineConfig
from sarathi_lab.engine.timer import CLOCKS
from sarathi_lab.profiling.machine import cores, default_device, fast_dtype, machine_record


def device_arg(text: str) -> str:
    """--device: cpu, or cuda where there is one (torch.device raised on 'gpu' or 'cuda:1', and a
    machine without CUDA on 'cuda', after the work had started)."""
    if text not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: must be cpu or cuda")
    if text == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError("'cuda' is invalid: no CUDA device is available here; allowed: cpu")
    return text


def add_common_args(parser: argparse.ArgumentParser, clock: bool = False, engine: bool = False) -> None:
    parser.add_argument("--device", type=device_arg, default=default_device())
    parser.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                        help="auto: bfloat16 on CUDA or on a CPU with bf16 units, else float32")
    if engine:
        parser.add_argument("--cpu-linear", choices=CPU_LINEARS, default="auto",
                            help="the engine's CPU linear layers over packed weights (auto: MKL's GEMM in "
                                 "float32 on an Intel CPU, oneDNN's otherwise; mkl: MKL's in float32 on any "
                                 "CPU; onednn: oneDNN's in every dtype), or F.linear (aten)")
    parser.add_argument("--threads", type=thread_count, default=None,
                        help="torch threads (default: every core the process may use)")
    if clock:
        parser.add_argument("--clock", choices=CLOCKS, default="wall",
                            help="cpu: the process's CPU time, for a machine shared with other jobs (with --threads 1)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes that finish in seconds (CI); options given on the command line keep their value")
    parser.add_argument("--out", type=table_path, help="also write the table to this file (.csv or .json)")


def check_clock(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--clock cpu times the work as a core of its own would only on the CPU with one thread: a GPU's
    time is not this process's, and with more threads their seconds (spin-waits too) add up."""
    if args.clock != "cpu":
        return
    if args.device == "cuda":
        parser.error("--clock cpu is invalid with --device cuda: it counts this process's CPU time, not the GPU's; "
                     "use --clock wall")
    threads = args.threads or cores()
    if threads != 1:
        given = "" if args.threads else " (the default: every core)"
        parser.error(f"--clock cpu is invalid with --threads {threads}{given}: CPU time is one core's time only with "
                     "one thread (the others' seconds, spin-waits too, add up); use --threads 1")


def apply_smoke(parser: argparse.ArgumentParser, argv: list[str] | None, args: argparse.Namespace,
                **sizes) -> None:
    """With --smoke, these tiny sizes for every option the command line does not give itself: an
    option given wins, as a Hydra debug config sits under the command line's overrides (before, --smoke
    replaced ``--reps 5`` silently)."""
    if args.smoke:
        given = given_options(parser, argv)
        for dest, value in sizes.items():
            if dest not in given:
                setattr(args, dest, value)


def given_options(parser: argparse.ArgumentParser, argv: list[str] | None) -> set[str]:
    """The dests the command line sets itself, abbreviations and ``--opt=value`` included: the same
    arguments parsed again with every default suppressed leave only those."""
    probe = copy.deepcopy(parser)
    for action in probe._actions:  # not set_defaults: that puts its values into the namespace
        action.default = argparse.SUPPRESS
    return set(vars(probe.parse_args(argv)))


def resolve_dtype(args) -> torch.dtype:
    if args.dtype == "auto":
        args.dtype = fast_dtype(args.device)
    return getattr(torch, args.dtype)


def engine_dtype(args) -> torch.dtype:
    """The dtype the engine runs for ``--dtype`` (bfloat16 runs as float32 on a CPU without bf16
    units), written back to ``args.dtype``: what a benchmark of the engine measures its ceilings in,
    and labels its tables with."""
    resolve_dtype(args)
    dtype = EngineConfig(model=args.model, device=args.device, dtype=args.dtype).torch_dtype
    args.dtype = str(dtype).removeprefix("torch.")
    return dtype


def setup_threads(threads: int | None) -> int:
    n = threads or cores()
    torch.set_num_threads(n)
    return n


def print_table(rows: list[dict], out: str | None = None, title: str | None = None,
                float_format: str = "{:.3f}", device: str = "cpu") -> pd.DataFrame:
    table = pd.DataFrame(rows)
    if title:
        print(f"\n## {title}")
    with pd.option_context("display.width", 200, "display.max_columns", 50):
        print(table.to_string(index=False, float_format=lambda x: float_format.format(x)))
    if out:
        write_table(table, out, device=device)
    return table


def write_table(table: pd.DataFrame, out: str, extra: dict | None = None, device: str = "cpu") -> None:
    """``device``: the one the table was measured on, which the JSON's machine record names."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".json":
        path.write_text(json.dumps({"machine": machine_record(device), **(extra or {}),
                                    "rows": table.to_dict(orient="records")}, indent=1, default=str))
    else:
        table.to_csv(path, index=False)
