"""The W&B report kept in the repository (docs/wandb_report.yaml) names only config keys runs have and
metrics their summaries hold, and builds with wandb-workspaces where that is installed."""
from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

from sarathi_lab.analysis.wandb_report import build, load_spec, names
from sarathi_lab.engine.metrics import Metrics, RequestRecord
from sarathi_lab.harness.cli_check import compose_config


def _dotted(tree, prefix=""):
    for key, value in tree.items():
        yield f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _dotted(value, f"{prefix}{key}.")


def test_the_report_reads_keys_the_runs_have():
    config_keys, summary_names = names(load_spec())
    known = set()
    for experiment in ("pd_ratio", "scheduler_latency"):
        known |= set(_dotted(OmegaConf.to_container(compose_config([f"experiment={experiment}"]), resolve=False)))
    assert config_keys <= known, sorted(config_keys - known)
    done = RequestRecord(0, prompt_len=8, arrival=0.0, output_len=3, first_scheduled=0.0, first_token=1.0,
                         finish=1.2, token_times=[1.0, 1.1, 1.2])
    summary = set(Metrics([], [done]).summary())
    assert summary_names <= summary, sorted(summary_names - summary)


def test_the_sections_are_the_papers_comparisons():
    spec = load_spec()
    titles = " | ".join(s["title"] for s in spec["sections"])
    for wanted in ("Chunk size vs TBT and TTFT", "P:D vs gain", "Scheduler vs latency"):
        assert wanted in titles
    figures = {k for s in spec["sections"] for p in s["panels"] for k in p.get("keys", [])}
    assert all(re.fullmatch(r"figure/\w+", k) for k in figures), "the sweep runs' image keys"


def test_it_builds_with_wandb_workspaces():
    pytest.importorskip("wandb_workspaces")
    report = build(load_spec(), "entity", "sarathi_lab")
    assert len(report.blocks) == 3 * len(load_spec()["sections"])
