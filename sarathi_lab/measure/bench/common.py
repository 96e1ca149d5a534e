"""What the benchmarks' command lines share; what they measure with lives in
``sarathi_lab.measure.profiling``."""
from __future__ import annotations

import argparse
import copy
import json
import random
from pathlib import Path

import pandas as pd
import torch

from sarathi_lab.config import CPU_LINEARS, DTYPES
from sarathi_lab.engine.timer import CLOCKS
from sarathi_lab.host_features import resolve_device, usable_cores
from sarathi_lab.measure.bench.args import table_path, thread_count
from sarathi_lab.measure.profiling.machine import fast_dtype, machine_record
from sarathi_lab.plan import torch_run_dtype


def device_arg(text: str) -> str:
    """Refused at parsing rather than after work started."""
    if text not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: must be cpu or cuda")
    if text == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError("'cuda' is invalid: no CUDA device is available here; "
                                         "allowed: cpu")
    return text


def add_common_args(parser: argparse.ArgumentParser, clock: bool = False,
                    engine: bool = False) -> None:
    parser.add_argument("--device", type=device_arg, default=resolve_device("auto"))
    parser.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                        help="auto: bfloat16 on CUDA or on a CPU with bf16 units, else float32")
    if engine:
        parser.add_argument("--cpu-linear", choices=CPU_LINEARS, default="auto",
                            help="the engine's CPU linear layers over packed weights, or F.linear "
                                 "(aten); docs/cpu_engine.md")
    parser.add_argument("--threads", type=thread_count, default=None,
                        help="torch threads (default: every core the process may use)")
    if clock:
        parser.add_argument("--clock", choices=CLOCKS, default="wall",
                            help="cpu: the process's CPU time, for a machine shared with other "
                                 "jobs (with --threads 1)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes that finish in seconds (CI); "
                             "options given on the command line keep their value")
    parser.add_argument("--out", type=table_path,
                        help="also write the table to this file (.csv or .json)")


def parse(parser: argparse.ArgumentParser, argv: list[str] | None, **smoke) -> argparse.Namespace:
    """--threads and --dtype resolved and written back: the tables' labels."""
    args = parser.parse_args(argv)
    # CPU time is a core's own only on the CPU with one thread: a GPU's is not this process's, and
    # more threads' seconds (spin-waits too) add up.
    if "clock" in args and args.clock == "cpu" and args.device == "cuda":
        parser.error("--clock cpu is invalid with --device cuda: it counts this process's CPU "
                     "time, not the GPU's; use --clock wall")
    if "clock" in args and args.clock == "cpu" and (args.threads or usable_cores()) != 1:
        given = f"{args.threads or usable_cores()}" + ("" if args.threads
                                                       else " (the default: every core)")
        parser.error(f"--clock cpu is invalid with --threads {given}: CPU time is one "
                     "core's time only with one thread (the others' seconds, spin-waits too, add "
                     "up); use --threads 1")
    apply_smoke(parser, argv, args, **smoke)
    if "threads" in args:
        args.threads = args.threads or usable_cores()
        torch.set_num_threads(args.threads)
    if "dtype" in args:
        dtype = fast_dtype(args.device) if args.dtype == "auto" else args.dtype
        if "model" in args:  # bfloat16 without bf16 units runs float32
            dtype = str(torch_run_dtype(dtype, args.device))
        args.dtype = dtype.removeprefix("torch.")
        args.torch_dtype = getattr(torch, args.dtype)
    return args


def apply_smoke(parser: argparse.ArgumentParser, argv: list[str] | None, args: argparse.Namespace,
                **sizes) -> None:
    """An option the command line gives wins, as overrides sit over a Hydra debug config."""
    if not args.smoke:
        return
    # Parsed again on a copy with the sizes as defaults: argparse's own reading of abbreviations.
    probe = copy.deepcopy(parser)
    probe.set_defaults(**sizes)
    again = probe.parse_args(argv)
    for dest in sizes:
        setattr(args, dest, getattr(again, dest))


def make_workload(requests: int, prompt_len: tuple[int, int], new_tokens: tuple[int, int],
                  vocab: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    lens = [rng.randint(*prompt_len) for _ in range(requests)]
    prompts = [[rng.randrange(vocab) for _ in range(n)] for n in lens]
    return prompts, [rng.randint(*new_tokens) for _ in range(requests)]


def print_table(rows: list[dict] | pd.DataFrame, out: str | None = None, title: str | None = None,
                float_format: str = "{:.3f}", device: str = "cpu",
                extra: dict | None = None) -> pd.DataFrame:
    """``extra``: the JSON's other keys."""
    table = pd.DataFrame(rows)
    if title:
        print(f"\n## {title}")
    with pd.option_context("display.width", 200, "display.max_columns", 50):
        print(table.to_string(index=False, float_format=float_format.format))
    if out:
        write_table(table, out, extra, device)
    return table


def write_table(table: pd.DataFrame, out: str, extra: dict | None = None,
                device: str = "cpu") -> None:
    """``device``: the one the JSON's machine record names."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".json":
        path.write_text(json.dumps({"machine": machine_record(device), **(extra or {}),
                                    "rows": table.to_dict(orient="records")}, indent=1,
                                    default=str))
    else:
        table.to_csv(path, index=False)
