"""Resuming a sweep: the command that resumes the one running here, printed when a signal stops it,
and the newest unfinished sweep of the same command, offered when that command runs again
(resumed without asking under on_existing=skip)."""
from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf

from sarathi_lab.harness.results import lock
from sarathi_lab.harness.sweep_state import SWEEP_LOCK, SweepState, sweep_state

PROGRAM = "python -m sarathi_lab.run"
SWEEP_DIR = "hydra.sweep.dir"
# The command line as typed (set by the CLI), and the resume command of the sweep running here.
_typed: list[str] | None = None
_resume: str | None = None


def note_command_line(args: list[str]) -> None:
    global _typed
    _typed = list(args)


def resume_command(args: list[str], sweep_dir: Path | str) -> str:
    kept = [a for a in args if not a.startswith(f"{SWEEP_DIR}=")]
    if not {"-m", "--multirun"} & set(kept):
        kept.insert(0, "-m")
    return f"{PROGRAM} {shlex.join([*kept, f'{SWEEP_DIR}={sweep_dir}'])}"


def sweep_started(config: DictConfig) -> None:
    """The command that resumes this sweep: as typed, else as Hydra recorded its overrides."""
    global _resume
    args = _typed
    if args is None:
        overrides = config.hydra.overrides
        args = ["-m", *(o for o in overrides.hydra if not o.startswith("hydra.mode=")),
                *overrides.task]
    _resume = resume_command(list(args), config.hydra.sweep.dir)


def resume_line() -> str | None:
    """What the user runs to resume the sweep this process is running; None: none is."""
    if _resume is None:
        return None
    return (f"to resume this sweep (its finished jobs kept, the others run), run the same command "
            f"into its directory: {_resume}")


def _normal(overrides: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(task, hydra) overrides, less what a rerun may change without being another sweep."""
    task, hydra = [], []
    for o in overrides:
        key = o.lstrip("+~").partition("=")[0]
        if key in (SWEEP_DIR, "hydra.mode", "on_existing"):
            continue
        (hydra if key.startswith(("hydra.", "hydra/")) else task).append(o)
    return tuple(sorted(task)), tuple(sorted(hydra))


def unfinished_sweep(overrides: list[str], sweep_dir: Path | str) -> tuple[Path, SweepState] | None:
    """The newest sweep beside ``sweep_dir`` (a new ${now:...} folder) launched with these same
    overrides that has finished jobs to keep but not all of them, and that no live sweep holds;
    None where a newer such sweep is complete, or none exists (one that finished no job offers
    nothing over a new sweep, and is passed over)."""
    wanted = _normal(overrides)
    parent = Path(sweep_dir).parent
    if not parent.is_dir():
        return None
    launched = sorted(parent.glob("*/multirun.yaml"), key=lambda p: p.stat().st_mtime, reverse=True)
    for record in launched:
        try:
            saved = yaml.safe_load(record.read_text())["hydra"]["overrides"]
            theirs = _normal([*saved.get("task", []), *saved.get("hydra", [])])
        except (OSError, yaml.YAMLError, KeyError, TypeError):
            continue
        if theirs != wanted:
            continue
        state = sweep_state(record.parent)
        if state.complete:
            return None
        if state.finished and not _held(record.parent):
            return record.parent, state
    return None


def _held(sweep_dir: Path) -> bool:
    try:
        fd = lock(sweep_dir / SWEEP_LOCK)
    except BlockingIOError:
        return True
    except OSError:
        return False
    if fd is not None:
        import os

        os.close(fd)
    return False


def offer(args: list[str], sweep_dir: Path, state: SweepState, skip: bool,
          ask: Callable[[str], str] | None = None) -> list[str]:
    """The command line to run: resuming into ``sweep_dir`` under on_existing=skip or when the
    user says so (on a terminal), else as given, with a line saying how to resume instead."""
    resumed = [*args, f"{SWEEP_DIR}={sweep_dir}"]
    where = f"an unfinished sweep of this same command is in {sweep_dir} ({state.describe()})"
    if skip:
        print(f"{where}: resuming it there (on_existing=skip): its finished jobs are kept, the "
              "others run", file=sys.stderr)
        return resumed
    if ask is None and sys.stdin.isatty() and sys.stderr.isatty():
        ask = input
    if ask is not None:
        answer = ask(f"{where}. Resume it there (its finished jobs kept)? [Y/n] ").strip().lower()
        if answer in ("", "y", "yes"):
            return resumed
        print("starting a new sweep", file=sys.stderr)
        return args
    print(f"{where}; this command starts a new sweep. To resume that one instead: "
          f"{resume_command(args, sweep_dir)} (or add on_existing=skip)", file=sys.stderr)
    return args


def planned_sweep_dir(config: DictConfig) -> tuple[Path, bool]:
    """The sweep's directory, and whether each launch gets a new one (a ${now:...} name)."""
    unresolved = OmegaConf.to_container(config.hydra.sweep, resolve=False).get("dir")
    return Path(str(config.hydra.sweep.dir)), "${now:" in str(unresolved)
