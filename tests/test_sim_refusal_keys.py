"""The simulator's cost models refuse a setting deep below the run (a device without a calibration, kernels
not measured, a profile unreadable), and the one line names the key as the user set it on the command line
(engine.sim_cost_model, engine.sim_device, engine.sim_tp), not the engine's bare field name; a key that
moved is refused naming the one that took its place. Each case starts the command in a fresh interpreter,
as a user does (LLM's keyword arguments, the bare names, are tests/test_sim_tensor_parallel.py's)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

SIM = ["executor=sim", "logger=none"]
# LLaMA-13B is none of the models whose GPU kernels were measured on an A100 (sim/data/gpu_kernels).
PROFILE_13B = [*SIM, "model=llama-13b", "engine.sim_device=a100", "engine.sim_cost_model=profile"]
MEASURED = "codellama-34b, internlm-20b, llama2-70b, llama2-7b, llama3-70b, llama3-8b, qwen-72b"
NO_CALIBRATION = ("error: engine.sim_cost_model='calibrated' is invalid with engine.sim_device='h200': its device file "
                  "has no calibration (no GPU kernels measured there); use 'roofline'")

CASES = {
    "calibrated where no GPU kernels were measured": (
        [*SIM, "engine.sim_device=h200", "engine.sim_cost_model=calibrated"], None, NO_CALIBRATION),
    # token_budget=auto builds the cost model before the plan does: the same line.
    "the same, asked by token_budget=auto": (
        [*SIM, "engine.sim_device=h200", "engine.sim_cost_model=calibrated", "scheduler=sarathi_serve",
         "token_budget=auto", "slo.tbt_p99_s=1"], None, NO_CALIBRATION),
    "GPU kernels not measured at this tensor parallelism": (
        [*PROFILE_13B, "engine.sim_tp=2"], None,
        (f"error: engine.sim_cost_model='profile' is invalid for this model on engine.sim_device='a100' at "
         f"engine.sim_tp=2: its GPU kernels were not measured (measured: {MEASURED}); use calibrated")),
    "an own profile under tensor parallelism": (
        [*PROFILE_13B, "engine.sim_tp=2"], "op,tokens\n",
        ("error: engine.sim_tp=2 is invalid with engine.sim_cost_model='profile' and a profile measured by "
         "task=profile: it times one device running the whole model; allowed: engine.sim_tp=1, or "
         "engine.sim_cost_model=calibrated or roofline")),
    "an unreadable profile": (
        PROFILE_13B, "",
        ("error: engine.sim_cost_model='profile' is invalid here: the profile {profiles}/a100/llama-13b.csv is "
         "unreadable (No columns to parse from file); run task=profile again")),
    "the piggyback chunk's alignment, moved to the scheduler": (
        ["task=piggyback", "measure.chunk_align=tile"], None,
        ("error: measure.chunk_align=tile is invalid: measure.chunk_align is not a known key; nearest known keys: "
         "scheduler.chunk_align")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_refusal_deep_in_the_simulator_names_the_key_the_user_set(case, tmp_path):
    args, profile, line = CASES[case]
    profiles = tmp_path / "profiles"
    if profile is not None:  # task=profile's table, where the run looks for it
        (profiles / "a100").mkdir(parents=True)
        (profiles / "a100" / "llama-13b.csv").write_text(profile)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "SARATHI", "WANDB"))}
    done = subprocess.run([sys.executable, "-m", "sarathi_lab.run", *args, f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=tmp_path, env=env | {"SARATHI_PROFILES_DIR": str(profiles)},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stdout[-1000:] + done.stderr[-2000:]
    assert done.stderr.splitlines() == [line.format(profiles=profiles)], done.stdout + done.stderr
    assert not list(tmp_path.rglob("metrics*.json"))
