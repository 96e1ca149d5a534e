"""Whether other work on the machine stretched a run's or a benchmark's timings: the share of time
its threads were ready but waited for a CPU (schedstat), 0 while idling by choice, which a load
average cannot tell apart. Without schedstat, the load average."""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from sarathi_lab.host_features import usable_cores

# Timings stretch by about wait / (1 - wait): beyond this, past the spread the experiments resolve.
UNRELIABLE_WAIT_SHARE = 0.10


@dataclass(frozen=True)
class LoadSnapshot:
    cpu_ns: int | None
    wait_ns: int | None  # ready to run but waiting for a CPU
    load1: float


def snapshot() -> LoadSnapshot:
    cpu = wait = 0
    try:
        for task in Path("/proc/self/task").iterdir():
            try:
                fields = (task / "schedstat").read_text().split()
            except OSError:
                continue  # the thread ended meanwhile
            cpu, wait = cpu + int(fields[0]), wait + int(fields[1])
    except OSError:
        cpu = wait = None
    return LoadSnapshot(cpu, wait, os.getloadavg()[0])


def assess(start: LoadSnapshot, end: LoadSnapshot) -> dict:
    """``timing_note`` is the warning, or None."""
    cores = usable_cores()
    record = {"cores": cores, "load1_start": start.load1, "load1_end": end.load1,
              "runqueue_wait_share": None}
    if start.cpu_ns is not None and end.cpu_ns is not None:
        cpu, wait = end.cpu_ns - start.cpu_ns, end.wait_ns - start.wait_ns
        share = wait / (cpu + wait) if cpu + wait > 0 else 0.0
        record["runqueue_wait_share"] = round(share, 4)
        unreliable = share > UNRELIABLE_WAIT_SHARE
        note = (f"timings unreliable: the run's threads waited for a CPU {share:.0%} of the time "
                f"they were ready (load average {start.load1:.1f} -> {end.load1:.1f} on {cores} "
                f"cores); rerun on a quiet machine")
    else:
        unreliable = start.load1 >= cores
        note = (f"timings unreliable: the load average was {start.load1:.1f} on {cores} cores when "
                f"the run "
                "started; rerun on a quiet machine")
    return record | {"timing_unreliable": unreliable, "timing_note": note if unreliable else None}


def contention(start: LoadSnapshot) -> str:
    """Judged as a run's are."""
    verdict = assess(start, snapshot())
    if verdict["timing_unreliable"]:
        warnings.warn(verdict["timing_note"], stacklevel=2)
    share = verdict["runqueue_wait_share"]
    if share is None:
        return f"load1 at start {verdict['load1_start']:.2f}"
    return f"waited for a CPU {share:.1%}"
