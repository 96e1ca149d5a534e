"""Where a run ran, recorded next to its numbers so that runs from different machines stay comparable."""
from __future__ import annotations

import json
import platform
import subprocess
from importlib import metadata
from typing import Any

import torch

from sarathi_lab.config import EngineConfig
from sarathi_lab.harness import PACKAGE_DIR
from sarathi_lab.profiling.machine import device_name

DISTRIBUTION = "sarathi-lab"


def collect_environment(engine: EngineConfig, device: torch.device, dtype: torch.dtype, cpu_gemm: str | None,
                        load: dict[str, Any], cuda_graphs: dict[str, Any] | None = None) -> dict[str, Any]:
    commit = _git("rev-parse", "HEAD")
    changes = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    version, installed_commit = _installed()
    return {
        **simulated_device(engine),
        # Where it ran: the device measured, or the host that ran the simulation.
        **({"host_device": str(device)} if engine.executor == "sim"
           else {"device": str(device), "device_name": device_name(device)}),
        # The dtype that ran, which the engine may have changed (bfloat16 on a CPU without bf16 units).
        "dtype": str(dtype).removeprefix("torch."),
        # The GEMM the CPU's linear layers ran on (model/cpu_linear.py); None off the CPU and in a simulation.
        "cpu_gemm": cpu_gemm,
        # The CUDA graphs forwards replayed (model/cuda_graphs.py's record): decode batch sizes, mixed
        # token buckets, capture seconds, the graphs' pool bytes and memory_reserved before and after
        # capture; None: every forward eager.
        "cuda_graphs": cuda_graphs,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "torch_threads": torch.get_num_threads(),
        **load,
        # The installed package's version (None: a clone never installed), and the clone's commit, else
        # the one pip recorded installing from a git URL.
        "sarathi_lab_version": version,
        "git_commit": commit or installed_commit,
        "git_dirty": None if changes is None else bool(changes),  # None: not known
    }


def simulated_device(engine: EngineConfig) -> dict[str, Any]:
    """What a run's executor was: for a simulation, the device, cost model and GPU count it predicted."""
    if engine.executor != "sim":
        return {"executor": engine.executor, "simulated": False}
    gpus = f"{engine.sim_tp}x " if engine.sim_tp > 1 else ""
    return {"executor": "sim", "simulated": True, "device": f"sim:{engine.sim_device}",
            "device_name": f"simulated {gpus}{engine.sim_device.upper()} ({engine.sim_cost_model} cost model)",
            "sim_device": engine.sim_device, "sim_cost_model": engine.sim_cost_model, "sim_tp": engine.sim_tp}


def _installed() -> tuple[str | None, str | None]:
    """The installed package's version, and the commit of the git URL pip installed it from (PEP 610)."""
    try:
        version = metadata.version(DISTRIBUTION)
        direct_url = metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None, None
    try:
        return version, json.loads(direct_url or "{}").get("vcs_info", {}).get("commit_id")
    except ValueError:
        return version, None


def _git(*args: str) -> str | None:
    # The package's own clone only: an installed copy (even in a venv inside some clone) has no commit.
    if _run_git("rev-parse", "--show-toplevel") != str(PACKAGE_DIR.parent):
        return None
    return _run_git(*args)


def _run_git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=PACKAGE_DIR, capture_output=True, text=True, timeout=10,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None
