"""``python -m sarathi_lab.produce`` runs each experiment's sweep as a user runs it and names the
experiments whose sweep failed; the analysis side only reads what it left."""
from __future__ import annotations

import subprocess
import sys

import pytest

from sarathi_lab.analysis import registry
from sarathi_lab.analysis.runs import EXPERIMENTS, Results
from sarathi_lab.harness import CONF_DIR, experiment_variants
from sarathi_lab.harness.compose import compose_config
from sarathi_lab.harness.schema import parse_config
from sarathi_lab.produce import SIM_CI_OVERRIDES, ceilings_needed, produce_missing, run_experiments, sweep_args

pytestmark = pytest.mark.e2e


def test_every_experiment_has_a_ci_scale_and_its_sweep_goes_under_the_root(tmp_path):
    # The quick set is experiment=ci/NAME, the one home of its overrides: its metrics.json says scale: ci.
    assert all(experiment_variants.exists(CONF_DIR, f"ci/{name}") for name in EXPERIMENTS)
    args = sweep_args("pd_ratio", tmp_path, "ci", ["seed=3"])
    assert args[:2] == ["-m", "experiment=ci/pd_ratio"] and args[-1] == "seed=3"
    assert args[2].startswith(f"hydra.sweep.dir={tmp_path.resolve()}/pd_ratio/multiruns/ci-")
    for sim, (model, executor) in ((False, ("tiny", "model")), (True, ("llama-13b", "sim"))):
        quick = [a for a in sweep_args("orca_compare", tmp_path, "ci", sim=sim) if not a.startswith("hydra.")]
        cfg = parse_config(compose_config(quick[1:]))
        assert (cfg.scale, cfg.model.name, cfg.engine.executor, cfg.chunk) == ("ci", model, executor, 32)


def test_the_simulated_set_runs_the_sim_configs_at_full_scale_and_the_quick_set_on_the_simulator(tmp_path):
    assert sweep_args("orca_compare", tmp_path, "full", sim=True)[:2] == ["-m", "experiment=sim/orca_compare"]
    quick = sweep_args("orca_compare", tmp_path, "ci", sim=True)
    assert quick[1] == "experiment=ci/orca_compare" and quick[-len(SIM_CI_OVERRIDES):] == SIM_CI_OVERRIDES


def test_every_simulated_result_runs_at_its_papers_shape_and_capacity_at_sarathi_serves(tmp_path):
    # Without sim/NAME, produce --sim fell back to the quick set's LLaMA-13B on an A6000 at the CPU
    # experiment's own dtype: float32 capacity searches that no A6000 holds.
    simulated = [n for n in EXPERIMENTS if registry.by_name(n).simulated]
    assert [n for n in simulated if not experiment_variants.exists(CONF_DIR, f"sim/{n}")] == []
    args = sweep_args("capacity", tmp_path, "full", sim=True)
    assert args[:2] == ["-m", "experiment=sim/capacity"]
    cfg = parse_config(compose_config([a for a in args[1:] if not a.startswith("hydra.")]))
    assert (cfg.name, cfg.model.name, cfg.dtype, cfg.engine.sim_device, cfg.engine.sim_cost_model) == (
        "capacity", "mistral-7b", "bfloat16", "a100", "calibrated")


def test_the_ci_capacity_search_is_the_one_run_reading_this_cpus_measured_ceilings():
    # What produce measures first on a fresh machine (the tests' ceilings are synthetic).
    assert ceilings_needed(EXPERIMENTS, "ci") == {"bfloat16": ["capacity"]}


def test_the_simulated_quick_set_of_a_measurement_and_a_serving_experiment_runs_with_no_model(tmp_path):
    names = ["decode_speedup", "pd_ratio"]
    assert run_experiments(names, tmp_path, "ci", sim=True) == []
    results = Results(tmp_path)
    for name in names:
        assert results.executor(name) == {"executor": "sim", "sim_device": "a6000", "sim_cost_model": "calibrated",
                                         "sim_tp": 1}
        assert results.source(name) == "simulated A6000 (calibrated)"
        assert set(results.summary(name).model) == {"llama-13b"}


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
