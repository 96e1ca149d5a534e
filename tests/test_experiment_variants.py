"""An experiment is one file: its variants (``experiment=ci/NAME``, ``gpu/NAME/PART``) are sections of
``conf/experiment/NAME.yaml`` that Hydra is served as the files they stand for
(hydra_plugins/sarathi_lab_launcher/experiment_source.py). Each section composes exactly as that
file, written out in a copy of conf/ where no section is served, composes."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
from hydra.core.plugins import Plugins
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf

from hydra_plugins.sarathi_lab_launcher.experiment_source import ExperimentSearchPath
from sarathi_lab.harness import CONF_DIR, experiment_variants
from sarathi_lab.harness.cli_check import check_command_line, compose_config

VARIANTS = experiment_variants.names(CONF_DIR)


def _composed(conf: Path, experiment: str) -> str:
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"experiment={experiment}"], return_hydra_config=True)
    cfg.hydra.runtime.config_sources = []   # where each came from: the copy's folder, not conf/'s
    return OmegaConf.to_yaml(cfg, resolve=False)


def _as_file(config: dict) -> str:
    return "# @package _global_\n" + yaml.safe_dump(config, sort_keys=False)


@pytest.fixture(scope="module")
def as_files(tmp_path_factory) -> Path:
    """conf/ with every section written out as its file, and the experiments without their sections."""
    conf = tmp_path_factory.mktemp("files") / "conf"
    shutil.copytree(CONF_DIR, conf)
    for name in VARIANTS:
        path = conf / "experiment" / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_as_file(experiment_variants.variant(CONF_DIR, name)))
    for path in (conf / "experiment").glob("*.yaml"):
        if (plain := experiment_variants.experiment(CONF_DIR, path.stem)) is not None:
            path.write_text(_as_file(plain))
    return conf


def test_the_scales_are_sections_of_their_experiment():
    assert {"ci/pd_ratio", "dry/pd_ratio", "sim/pd_ratio", "gpu/pd_ratio", "own/pd_ratio",
            "gpu/capacity/strict", "own/scheduler_latency/seed0"} <= set(VARIANTS)
    assert not [p for p in (CONF_DIR / "experiment").rglob("*.yaml")
                if p.parent.name in experiment_variants.SCALES and not p.stem.startswith("_")
                and (CONF_DIR / "experiment" / f"{p.stem}.yaml").is_file()]


@pytest.mark.parametrize("name", [*VARIANTS, "pd_ratio", "capacity"])
def test_a_section_composes_as_the_file_it_stands_for(as_files, name):
    assert _composed(CONF_DIR, name) == _composed(as_files, name)


def test_hydra_never_sees_the_sections():
    cfg = compose_config(["experiment=pd_ratio"], hydra=True)
    assert experiment_variants.SECTIONS not in cfg
    ci = compose_config(["experiment=ci/pd_ratio"])   # the experiment, /scale/ci, then the section
    assert (ci.name, ci.tags[1], ci.scale, ci.seq_len) == ("pd_ratio", "fig9", "ci", 96)
    # A part: the experiment, its scale's section, then the part's.
    params = compose_config(["experiment=own/capacity/strict"], hydra=True).hydra.sweeper.params
    assert (params.model, params["workload.num_requests"], params.slo) == ("mistral-7b", 512, "strict")


def test_an_unknown_variant_is_refused_in_one_line_naming_the_allowed():
    problem = check_command_line(["experiment=ci/nonexistent"])
    assert problem.startswith("experiment='ci/nonexistent' is invalid: allowed values are ")
    assert "ci/pd_ratio" in problem and "own/capacity/strict" in problem and "\n" not in problem


def test_a_section_of_no_scale_is_refused_naming_the_file_and_key(tmp_path):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "toy.yaml").write_text("name: toy\nvariants:\n  big: {seq_len: 8}\n")
    with pytest.raises(experiment_variants.VariantError, match=r"toy.yaml: variants.big is invalid: allowed"):
        experiment_variants.names(tmp_path)


def test_another_apps_search_path_is_left_alone(tmp_path):
    # Hydra finds it (it imports the plugin modules itself, so as classes of its own).
    assert "ExperimentSearchPath" in [p.__name__ for p in Plugins.instance().discover(SearchPathPlugin)]
    for main, served in ((str(tmp_path), False), (f"file://{CONF_DIR}", True), (str(CONF_DIR), True)):
        path = ConfigSearchPathImpl()
        path.append("main", main)
        ExperimentSearchPath().manipulate_search_path(path)
        assert path.get_path()[0].provider == ("sarathi_lab experiment variants" if served else "main")
