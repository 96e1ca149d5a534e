"""A simulated run (``python -m sarathi_lab.run executor=sim``) imports what it runs: not the lab's
model, its attention backends, kernels or CUDA graphs, nor torch or transformers (a preset is plain
data, model.spec), nor pandas (its tables are written from arrow arrays); and its results are the ones
it gave before its imports were trimmed."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sarathi_lab.config import REPO_ROOT

RUN = """
import json, runpy, sys
sys.argv = ["run", "executor=sim", "model=llama2-7b", "engine.sim_device=a100", "scheduler=sarathi_serve",
            "chunk=512", "batch_size=16", "workload.num_requests=30", "seq_len=1280", "pd_ratio=4",
            "engine.num_kv_blocks=2000", "logger=none", "hydra.run.dir=" + sys.argv[1]]
try:
    runpy.run_module("sarathi_lab.run", run_name="__main__")
finally:
    print(json.dumps(sorted(m for m, v in sys.modules.items() if v is not None)))
"""
# Modules a simulated run has no use for: what builds and runs the model, and the libraries it runs on.
NOT_IMPORTED = ("sarathi_lab.model.decoder", "sarathi_lab.model.layers", "sarathi_lab.model.loader",
                "sarathi_lab.model.runner", "sarathi_lab.model.cuda_graphs", "sarathi_lab.model.executor",
                "sarathi_lab.model.cpu_linear", "sarathi_lab.attention", "sarathi_kernels.cpu_attention",
                "sarathi_kernels.cpu_ops", "triton", "torch", "transformers", "pandas")


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim_run")
    done = subprocess.run([sys.executable, "-c", RUN, str(out / "run")], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(json.loads(done.stdout.strip().splitlines()[-1])), json.loads((out / "run" / "metrics.json").read_text())


def test_a_sim_run_imports_no_model_code_nor_torch(sim_run):
    modules, _ = sim_run
    assert [m for m in NOT_IMPORTED if m in modules] == []


def test_a_sim_run_gives_the_results_it_gave_before(sim_run):
    summary = sim_run[1]["summary"]
    assert (summary["num_iterations"], summary["makespan_s"], summary["kv_tokens_read"],
            summary["ttft_p50_s"], summary["itl_p99_s"]) == (542, 9.006257363099483, 8881032, 1.070059360766915,
                                                             0.03713344707569366)
