"""The machine a measurement ran on: one description for records, tables and figures."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from sarathi_kernels.cpu_build import cpuinfo

from sarathi_lab.harness.environment import device_name
from sarathi_lab.host_features import cpu_has_bf16_units, usable_cores
from sarathi_lab.measure.profiling import isa
from sarathi_lab.sim.device import cpu_name  # the simulator keys ceilings by it

if TYPE_CHECKING:  # a simulated run's records read this module and load no torch
    import torch

# bfloat16 on a CPU needs the bf16 ones
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")


def cpu_flags() -> set[str]:
    """Less those of the ISA kind the process is held to (measure/profiling/isa.py)."""
    kind = isa.active()
    return {f for f in cpuinfo("flags").split() if kind is None or kind[1].has(f)}


def cpu_isa() -> str:
    """"?" where the flags cannot be read."""
    have = cpu_flags()
    return (",".join(f for f in ISA_FLAGS if f in have) or "none") if have else "?"


def llc_mib(cache_dir: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """CPUs of one name differ in it; a model whose weights fit decodes from cache back to back."""
    units, sizes = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}, {}
    for index in cache_dir.glob("index*"):
        try:
            level, size = int((index / "level").read_text()), (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if size[:-1].isdigit() and size[-1] in units:
            sizes[level] = int(size[:-1]) * units[size[-1]]
    return sizes[max(sizes)] >> 20 if sizes else None


def machine_record(device: torch.device | str = "cpu") -> dict:
    import torch

    kind = isa.active()
    return {"device": device_name(device), "cpu": cpu_name(), "cores": usable_cores(),
            "isa": cpu_isa(), "isa_as": kind[0] if kind else None,
            "bf16_units": cpu_has_bf16_units(), "llc_mib": llc_mib(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "load1": round(os.getloadavg()[0], 2)}


def describe_machine(device: torch.device | str) -> str:
    r = machine_record(device)
    held = f" (held to the {r['isa_as']} kind: measure/profiling/isa.py)" if r["isa_as"] else ""
    return (f"# machine: {r['device']} | cores {r['cores']} | isa {r['isa']}{held} | last-level "
            f"cache {r['llc_mib'] or '?'} MiB | torch {r['torch']}"
            f" | threads {r['threads']} | load1 {r['load1']:.2f}")
