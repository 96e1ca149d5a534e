"""The CLI's config composition and run, callable in-process (notebooks, tests):

    cfg = compose_config(["experiment=smoke", "chunk=128"])
    run_in_process(["experiment=smoke"], Path("outputs/nb/0"))
"""
from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from sarathi_lab.harness import CONF_DIR
from sarathi_lab.harness.results import Status
from sarathi_lab.harness.runner import RunContext, run_experiment
from sarathi_lab.harness.schema import parse_config


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides or []))


def run_in_process(overrides: list[str], output_dir: Path, group: str | None = None) -> Status:
    """One run as `python -m sarathi_lab.run *overrides` would do it, into output_dir."""
    cfg = compose_config(overrides)
    run_cfg = parse_config(cfg)
    output_dir.mkdir(parents=True, exist_ok=True)
    ctx = RunContext(output_dir=output_dir, overrides=list(overrides), run_name=",".join(overrides) or run_cfg.name,
                     group=group)
    return run_experiment(run_cfg, OmegaConf.to_container(cfg, resolve=True), ctx)
