"""Whether other work on the machine stretched a run's or a benchmark's timings (a run's
`environment.timing_unreliable`; a benchmark's header line and warning).

The measure is the share of the time the run's threads were ready to run but waited for a CPU
(/proc/self/task/*/schedstat): exactly the contention that inflates wall-clock timings, and 0 while
a run idles by choice, which a load average cannot tell apart. Without schedstat, the load average.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from sarathi_lab.config import usable_cores

# Above this share of waiting, wall-clock timings are stretched by about wait / (1 - wait): 10% ~ +11%,
# beyond the run-to-run spread the experiments resolve.
UNRELIABLE_WAIT_SHARE = 0.10


@dataclass(frozen=True)
class LoadSnapshot:
    cpu_ns: int | None      # the process's threads' time on a CPU
    wait_ns: int | None     # ... and ready to run but waiting for one
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
    """The record metrics.json keeps under environment; `timing_note` is the warning, or None."""
    cores = usable_cores()
    record = {"cores": cores, "load1_start": start.load1, "load1_end": end.load1,
              "runqueue_wait_share": None}
    if start.cpu_ns is not None and end.cpu_ns is not None:
        cpu, wait = end.cpu_ns - start.cpu_ns, end.wait_ns - start.wait_ns
        share = wait / (cpu + wait) if cpu + wait > 0 else 0.0
        record["runqueue_wait_share"] = round(share, 4)
        unreliable = share > UNRELIABLE_WAIT_SHARE
        note = (f"timings unreliable: the run's threads waited for a CPU {share:.0%} of the time they were ready "
                f"(load average {start.load1:.1f} -> {end.load1:.1f} on {cores} cores); rerun on a quiet machine")
    else:
        unreliable = start.load1 >= cores
        note = (f"timings unreliable: the load average was {start.load1:.1f} on {cores} cores when the run "
                "started; rerun on a quiet machine")
    return record | {"timing_unreliable": unreliable, "timing_note": note if unreliable else None}


def contention(start: LoadSnapshot) -> str:
    """A benchmark's word on its own timings since ``start``, judged as a run's are: how long its
    threads waited for a CPU, with a warning where that makes them unreliable."""
    verdict = assess(start, snapshot())
    if verdict["timing_unreliable"]:
        warnings.warn(verdict["timing_note"], stacklevel=2)
    share = verdict["runqueue_wait_share"]
    return f"waited for a CPU {share:.1%}" if share is not None else f"load1 at start {verdict['load1_start']:.2f}"
