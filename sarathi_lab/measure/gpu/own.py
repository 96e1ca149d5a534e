"""The suite on your own GPU (``--own``): the paper's setting, no budget, under outputs/."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from sarathi_lab.config import REPO_ROOT, device_slug
from sarathi_lab.measure.gpu.plan import Step
from sarathi_lab.measure.gpu.progress import Progress

ROOT = REPO_ROOT / "outputs" / "paper_gpu"
DRY = "dry-run"
# From a child: the driver never imports torch (a broken CUDA costs a step, not the run).
_PROBE = "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else '')"


def gpu_name() -> str:
    """'' where torch sees no device (or cannot be imported)."""
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                          check=False)
    out = done.stdout.strip()
    return out.splitlines()[-1] if done.returncode == 0 and out else ""


def device_folder(dry_run: bool) -> str:
    """outputs/paper_gpu/'s folder: the chip or 'dry-run'; ValueError without a GPU."""
    if dry_run:
        return DRY
    name = gpu_name()
    if not name:
        raise ValueError("--own is invalid here: torch sees no CUDA GPU; --own --dry-run runs "
                         "every step on the CPU at tiny shapes")
    return device_slug(name)


def out_dir(out: Path | None, dry_run: bool) -> Path:
    """--out, else device_folder; a ValueError without a GPU, or for a folder inside docs/."""
    folder = device_folder(dry_run)
    out = out or ROOT / folder
    if out.resolve().is_relative_to((REPO_ROOT / "docs").resolve()):
        raise ValueError(f"--out={out} is invalid: --own writes outputs, never into docs/ (python "
                         "-m sarathi_lab.analysis.publish keeps results there, checking what it "
                         "would replace)")
    return out


class Stopped(Exception):
    """SIGTERM to the driver: stop the worker as on Ctrl-C."""


def start(out: Path, todo: list[Step], dry_run: bool) -> Progress:
    """Stop on SIGTERM as on Ctrl-C; returns the progress the driver prints."""
    def stop(signum, _frame):
        raise Stopped(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    watch = Progress(out, todo, dry_run)
    if todo:
        print(f"[own] {len(todo)} steps to run, {sum(s.minutes for s in todo):.0f} min expected by "
              "the plan; Ctrl-C stops, the same command resumes", flush=True)
    return watch


def finish(watch: Progress, out: Path) -> None:
    for line in [*watch.poll(), *results_note(out)]:
        print(f"[own] {line}" if not line.startswith("[own]") else line)


def results_note(out: Path) -> list[str]:
    """What the folder holds, the claims and figures first."""
    figures = sorted((out / "figures").glob("*.png"))
    lines = [f"results in {out}:"]
    lines += [f"  {name}" for name in ("claims.md", "claims.csv", "summary.csv")
              if (out / name).is_file()]
    lines.append(f"  figures/: {len(figures)} ({', '.join(p.stem for p in figures) or 'none yet'})")
    return lines
