"""``python -m sarathi_lab.produce`` runs each experiment's sweep as a user runs it and names the
experiments whose sweep failed; the analysis side only reads what it left."""
from __future__ import annotations

import subprocess
import sys

import pytest

from sarathi_lab.analysis.runs import EXPERIMENTS, Results
from sarathi_lab.produce import CI_OVERRIDES, produce_missing, run_experiments, sweep_args

pytestmark = pytest.mark.e2e


def test_every_experiment_has_a_ci_scale_and_its_sweep_goes_under_the_root(tmp_path):
    assert set(CI_OVERRIDES) == set(EXPERIMENTS)
    args = sweep_args("pd_ratio", tmp_path, "ci", ["seed=3"])
    assert args[:2] == ["-m", "experiment=pd_ratio"] and args[-1] == "seed=3"
    assert args[2].startswith(f"hydra.sweep.dir={tmp_path.resolve()}/pd_ratio/multiruns/ci-")


def test_a_failed_sweep_is_named_and_the_others_still_run(tmp_path):
    # A bad value fails every job of the first sweep at its checks, before any model is built.
    failed = run_experiments(["pd_ratio"], tmp_path, "ci", ["pd_ratio=nan"])
    assert failed == ["pd_ratio"]
    assert Results(tmp_path).missing() == list(EXPERIMENTS)


def test_nothing_is_run_when_nothing_is_missing(tmp_path, monkeypatch):
    results = Results(tmp_path)
    monkeypatch.setattr(Results, "missing", lambda self: [])
    assert produce_missing(results) is results


def test_the_command_refuses_an_unknown_experiment():
    out = subprocess.run([sys.executable, "-m", "sarathi_lab.produce", "pd_ration"], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 2 and "unknown experiment 'pd_ration'" in out.stderr
