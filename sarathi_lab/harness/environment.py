"""Where a run ran, recorded next to its numbers so that runs from different machines stay comparable."""
from __future__ import annotations

import platform
import subprocess
from typing import Any

import torch

from sarathi_lab.harness import PACKAGE_DIR
from sarathi_lab.profiling.machine import device_name


def collect_environment(device: torch.device, dtype: torch.dtype, cpu_gemm: str | None,
                        load: dict[str, Any]) -> dict[str, Any]:
    return {
        "device": str(device),
        # The dtype that ran, which the engine may have changed (bfloat16 on a CPU without bf16 units).
        "dtype": str(dtype).removeprefix("torch."),
        # The GEMM the CPU's linear layers ran on (model/cpu_linear.py), which cpu_linear=auto picks
        # by the CPU's vendor; None off the CPU.
        "cpu_gemm": cpu_gemm,
        "device_name": device_name(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "torch_threads": torch.get_num_threads(),
        # Other work on the machine slows a CPU run: harness/load.py.
        **load,
        "git_commit": _git("rev-parse", "HEAD"),
        # Results from uncommitted code cannot be traced back to a commit alone; None: not known.
        "git_dirty": _dirty(),
    }


def _dirty() -> bool | None:
    changes = _git("status", "--porcelain", "--untracked-files=no")
    return None if changes is None else bool(changes)


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
