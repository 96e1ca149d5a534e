"""A rerun sweep's stale job folders moved aside into STALE/<when>/, never read as its own."""
from __future__ import annotations

import logging
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from sarathi_lab.harness.job_dirs import RESOLVER, job_dir_name
from sarathi_lab.harness.results import METRICS, STATUS, WANDB_DIR, natural_order, next_dir

log = logging.getLogger(__name__)
STALE = ".stale"


def expected_job_dirs(config: DictConfig, jobs: list[list[str]]) -> set[str] | None:
    """The folders ``jobs`` get, or None where hydra.sweep.subdir is not our NUM_overrides."""
    from hydra._internal.config_loader_impl import get_overrides_dirname
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    subdir = OmegaConf.to_container(config.hydra.sweep, resolve=False).get("subdir")
    if RESOLVER not in str(subdir):
        return None
    naming = config.hydra.job.config.override_dirname
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    return {job_dir_name(num, get_overrides_dirname(parser.parse_overrides(list(overrides)),
                                                    list(naming.exclude_keys),
                                                    naming.item_sep, naming.kv_sep))
            for num, overrides in enumerate(jobs)}


def job_folders(sweep_dir: Path) -> list[str]:
    if not sweep_dir.is_dir():
        return []
    return [p.name for p in sorted(sweep_dir.iterdir(), key=natural_order)
            if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
            and p.name != WANDB_DIR
            and any((p / name).exists() for name in (STATUS, METRICS, ".hydra"))]


def move_stale(sweep_dir: Path, current: set[str]) -> list[str]:
    stale = [job for job in job_folders(sweep_dir) if job not in current]
    if not stale:
        return []
    aside = sweep_dir / STALE / time.strftime("%Y-%m-%d_%H-%M-%S")
    aside.mkdir(parents=True, exist_ok=True)
    for job in stale:
        for folder in (sweep_dir / job, next_dir(sweep_dir / job)):
            if folder.exists():
                folder.rename(aside / folder.name)
    shown = ", ".join(stale[:8]) + (f" and {len(stale) - 8} more" if len(stale) > 8 else "")
    log.warning("%d job folder%s of an earlier launch into %s %s none of this sweep's jobs "
                "(its swept values changed): moved aside into %s, where no reader reads them: %s",
                len(stale), "s" * (len(stale) != 1), sweep_dir,
                "is" if len(stale) == 1 else "are", aside, shown)
    return stale
