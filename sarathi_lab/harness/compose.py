"""The CLI's config composition and run, callable in-process (notebooks, tests):
``run_in_process(["experiment=smoke"], Path("outputs/nb/0"))``, a config composed elsewhere
(``run_composed``: a run rebuilt from the config another recorded), or a sweep in a process of its
own (``run_as_command(["-m", "experiment=smoke"])``)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from sarathi_lab.harness import REPO_ROOT
from sarathi_lab.harness.cli_check import compose_config
from sarathi_lab.harness.interrupts import run_child
from sarathi_lab.harness.results import Status, write_status
from sarathi_lab.harness.runner import RunContext, record_failure, run_experiment
from sarathi_lab.harness.schema import parse_config

__all__ = ["compose_config", "run_as_command", "run_composed", "run_in_process"]


def run_in_process(overrides: list[str], output_dir: Path, group: str | None = None) -> Status:
    """One run as `python -m sarathi_lab.run *overrides` would do it, into output_dir."""
    return run_composed(compose_config(overrides), overrides, output_dir, group)


def run_composed(cfg: DictConfig, overrides: list[str], output_dir: Path,
                 group: str | None = None) -> Status:
    """One run of ``cfg`` into output_dir, recording ``overrides`` as its command line."""
    run_cfg = parse_config(cfg)
    ctx = RunContext(output_dir=output_dir, overrides=list(overrides), group=group)
    try:
        status = run_experiment(run_cfg, OmegaConf.to_container(cfg, resolve=True), ctx)
        write_status(ctx.status_dir, status)
    except BaseException as e:
        if ctx.status_dir is not None:  # else the directory is another run's
            record_failure(ctx.status_dir, e)
        raise
    finally:
        ctx.release()
    return status


def run_as_command(args: list[str], quiet: bool = False, stderr=None) -> int:
    """`python -m sarathi_lab.run *args`'s exit status; it imports the same sarathi_lab as this
    process, wherever that was imported from. A signal to this process (interrupts.py) ends the
    run and every process it started, the run recording itself as interrupted."""
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return run_child([sys.executable, "-m", "sarathi_lab.run", *args],
                     env=os.environ | {"PYTHONPATH": path},
                     stdout=subprocess.DEVNULL if quiet else None, stderr=stderr)
