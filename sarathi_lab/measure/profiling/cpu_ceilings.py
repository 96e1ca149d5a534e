"""This CPU's ceilings as the simulator reads them (sim_device=cpu): copy bandwidth and matmul
rate at the benchmarks' sizes, written with the machine, threads and time of the measurement to
the file sim/device.py reads, so that a simulation measures nothing.

    python -m sarathi_lab.measure cpu_ceilings [--dtype bfloat16]
"""
from __future__ import annotations

import logging
import os
from datetime import datetime, timezone

from sarathi_lab import cli_args, host_load
from sarathi_lab.config import DTYPES
from sarathi_lab.sim import device as sim

log = logging.getLogger(__name__)


def measure(dtype: str = "bfloat16") -> dict:
    """In the dtype the engine runs for ``dtype``."""
    import json

    import torch

    from sarathi_lab.measure.profiling.ceilings import measure_ceilings

    run = sim.device_dtype("cpu", dtype)
    start = host_load.snapshot()
    ceil = measure_ceilings("cpu", getattr(torch, run))
    # Other work on the cores lowers both rates, and every budget sized by them: said, as a run's.
    load = host_load.assess(start, host_load.snapshot())
    entry = {"copy_gbps": ceil.copy_gbps, "matmul_gflops": ceil.matmul_gflops,
             "cpu": sim.cpu_name(), "dtype": run, "threads": ceil.threads,
             "copy_mib": ceil.copy_mib, "matmul_n": ceil.matmul_n,
             "measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
             "writer": sim.MEASURE_COMMAND,
             **{key: load[key] for key in ("runqueue_wait_share", "timing_unreliable",
                                           "timing_note")}}
    path = sim.cpu_ceilings_path()
    try:
        entries = sim.read_cpu_ceilings(path)
    except ValueError as e:
        log.warning("the CPU ceilings %s are %s: writing them anew", path, e)
        entries = {}
    entries[sim.cpu_ceilings_key(dtype)] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(entries, indent=1))
    os.replace(tmp, path)
    return entry


def ensure(dtype: str = "bfloat16") -> dict | None:
    """Where its file holds none in ``dtype`` (or cannot be read): what it measured; else None."""
    try:
        if sim.cpu_ceilings_key(dtype) in sim.read_cpu_ceilings(sim.cpu_ceilings_path()):
            return None
    except ValueError:
        pass
    return measure(dtype)


def measured_line(entry: dict, why: str) -> str:
    """One line on ceilings just measured for ``why``, and whether other work distorted them."""
    line = (f"measured this CPU's ceilings in {entry['dtype']} for {why} (none were in "
            f"{sim.cpu_ceilings_path()}): copy {entry['copy_gbps']:.3g} GB/s, matmul "
            f"{entry['matmul_gflops']:.3g} GFLOP/s with {entry['threads']} threads")
    if entry.get("timing_unreliable"):
        share = entry.get("runqueue_wait_share")
        how = (f"its threads waited for a CPU {share:.0%} of the time they were ready"
               if share is not None else "the load average was past the cores")
        line += (f"; other work distorted them ({how}), so the budgets they size are too small: "
                 f"{sim.MEASURE_COMMAND} --dtype {entry['dtype']} on a quiet machine measures "
                 "them again")
    return line


def main(argv: list[str] | None = None) -> dict:
    parser = cli_args.Parser(prog=sim.MEASURE_COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    args = parser.parse_args(argv)
    entry = measure(args.dtype)
    print(f"{sim.cpu_ceilings_path()}: {sim.cpu_ceilings_key(args.dtype)}: "
          f"copy {entry['copy_gbps']:.3g} GB/s, matmul {entry['matmul_gflops']:.3g} GFLOP/s "
          f"with {entry['threads']} threads")
    return entry
