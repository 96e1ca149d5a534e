"""What the benchmarks of this package share: arguments, the machine's description, tables."""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import warnings
from pathlib import Path

import pandas as pd
import torch

from sarathi_lab.config import CPU_LINEARS, cpu_has_bf16_units

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Above this 1-minute load average on the benchmark's cores the numbers are taken under contention.
QUIET_LOAD = 1.2


def auto_dtype(device: str) -> str:
    """bfloat16 where it has hardware (CUDA, or a CPU with AVX512-BF16/AMX), else float32: the
    dtype the engine itself runs when asked for bfloat16."""
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return "bfloat16"
    return "bfloat16" if cpu_has_bf16_units() else "float32"


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def add_common_args(parser: argparse.ArgumentParser, clock: bool = False, engine: bool = False) -> None:
    parser.add_argument("--device", default=default_device())
    parser.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                        help="auto: bfloat16 on CUDA or on a CPU with bf16 units, else float32")
    if engine:
        parser.add_argument("--cpu-linear", choices=CPU_LINEARS, default="onednn",
                            help="the engine's CPU linear layers: oneDNN over packed weights, or F.linear (MKL)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: every core the process may use)")
    if clock:
        parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                            help="cpu: the process's CPU time, for a machine shared with other jobs (with --threads 1)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes that finish in seconds (CI)")
    parser.add_argument("--out", help="also write the table to this file (.csv or .json)")


def resolve_dtype(args) -> torch.dtype:
    if args.dtype == "auto":
        args.dtype = auto_dtype(args.device)
    return DTYPES[args.dtype]


def setup_threads(threads: int | None) -> int:
    n = threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(n)
    return n


def load_average() -> float:
    return os.getloadavg()[0]


def warn_if_loaded() -> float:
    load = load_average()
    if load > QUIET_LOAD:
        warnings.warn(f"1-min load average is {load:.2f} (> {QUIET_LOAD}): timings are taken under contention",
                      stacklevel=2)
    return load


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_isa() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return "?"
    have = set(flags.split(":", 1)[1].split())
    wanted = ["avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"]
    return ",".join(f for f in wanted if f in have) or "none"


def describe_machine() -> str:
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else cpu_name()
    return (f"# machine: {dev} | cores {len(os.sched_getaffinity(0))} | isa {cpu_isa()} | torch {torch.__version__}"
            f" | threads {torch.get_num_threads()} | load1 {load_average():.2f}")


def machine_record() -> dict:
    return {"cpu": cpu_name(), "cores": len(os.sched_getaffinity(0)), "isa": cpu_isa(),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "load1": round(load_average(), 2)}


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def median_time(fn, reps: int, warmup: int = 1, sync=None, clock: str = "wall", best: bool = False) -> float:
    """Median seconds of ``fn()`` over ``reps`` calls after ``warmup`` untimed ones. ``clock="cpu"``
    counts the process's CPU time instead of wall time: with one thread, the time the work takes on
    a core of its own, the way to compare numbers on a machine that other jobs share. ``best``: the
    fastest call instead of the median (for ceilings: what the hardware can do)."""
    sync = sync or (lambda: None)
    now = CLOCKS[clock]
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = now()
        fn()
        sync()
        times.append(now() - t0)
    return min(times) if best else statistics.median(times)


def print_table(rows: list[dict], out: str | None = None, title: str | None = None,
                float_format: str = "{:.3f}") -> pd.DataFrame:
    table = pd.DataFrame(rows)
    if title:
        print(f"\n## {title}")
    with pd.option_context("display.width", 200, "display.max_columns", 50):
        print(table.to_string(index=False, float_format=lambda x: float_format.format(x)))
    if out:
        write_table(table, out)
    return table


def write_table(table: pd.DataFrame, out: str, extra: dict | None = None) -> None:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".json":
        path.write_text(json.dumps({"machine": machine_record(), **(extra or {}),
                                    "rows": table.to_dict(orient="records")}, indent=1, default=str))
    else:
        table.to_csv(path, index=False)
