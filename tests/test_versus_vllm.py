"""Our engine beside vLLM: the side-by-side figure and claims from both engines' runs
(analysis/versus_vllm.py), a sweep over ``executor=model,vllm`` as any axis, and the capacity search
on vLLM. The runs on vLLM need the extra installed."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from sarathi_lab.analysis import versus_vllm
from sarathi_lab.config import EngineConfig
from sarathi_lab.executors import task_refusal
from sarathi_lab.harness import vllm_args
from sarathi_lab.plan import plan_engine

NEEDS_VLLM = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason='vLLM is not installed (pip install -e ".[vllm]")')


def _runs(tbt: dict[tuple[str, str, float], float], seeds=(0, 1)) -> pd.DataFrame:
    """load_runs' rows of a versus_vllm sweep: P99 TBT by (executor, scheduler, qps), the same each seed
    but for a seed's small offset."""
    rows = []
    for (executor, scheduler, qps), p99 in tbt.items():
        for seed in seeds:
            rows.append({"executor": executor, "scheduler": scheduler, "workload.qps": qps, "seed": seed,
                         "itl_p99_s": p99 + 0.001 * seed, "ttft_p50_s": 0.2, "ttft_p99_s": 0.9,
                         "total_throughput_tok_s": 300.0, "model": "cpu-small", "num_requests": 8,
                         "device": "cpu", "dtype": "float32", "env.device_name": "a CPU",
                         "env.torch_threads": 2, "env.git_commit": "abcdef0123",
                         "env.timing_unreliable": executor == "vllm", "env.cores": 2,
                         "env.load1_start": 3.0 + seed, "env.load1_end": 2.5,
                         "env.vllm_version": "0.32.0" if executor == "vllm" else None})
    return pd.DataFrame(rows)


TBT = {("vllm", "sarathi_serve", 0.5): 0.10, ("vllm", "vllm", 0.5): 0.30,
       ("vllm", "sarathi_serve", 1.0): 0.12, ("vllm", "vllm", 1.0): 0.50,
       ("model", "sarathi_serve", 0.5): 0.09, ("model", "vllm", 0.5): 0.08,
       ("model", "sarathi_serve", 1.0): 0.10, ("model", "vllm", 1.0): 0.40}


def test_the_stall_free_claim_is_judged_on_vllm_and_on_ours_apart():
    rows = {r["claim"]: r for r in versus_vllm.claims_rows(versus_vllm.named(_runs(TBT)))}
    on_vllm, ours = rows[versus_vllm.STALL_FREE], rows[versus_vllm.OURS]
    assert on_vllm["holds"] == "yes" and on_vllm["source"] == "measured CPU, vLLM 0.32.0"
    # Ours is lower at 1 req/s only.
    assert ours["holds"] == "partly" and ours["source"] == "measured CPU"
    assert "qps 0.5: on 100 ms, off 300 ms (2.99x)" in on_vllm["ours"]
    assert on_vllm["scale"] == "cpu-small, 8 requests a run at 0.5, 1 req/s, seeds 0, 1"
    assert "8 of 16 runs flagged timing_unreliable (a busy machine, load average 2.5 to 4.0 on 2 cores)" in \
        on_vllm["left out"]
    assert set(on_vllm) <= set(versus_vllm.claims.COLUMNS)


def test_a_missing_mode_is_not_judged():
    tbt = {k: v for k, v in TBT.items() if k != ("vllm", "vllm", 1.0)}
    rows = {r["claim"]: r for r in versus_vllm.claims_rows(versus_vllm.named(_runs(tbt)))}
    assert rows[versus_vllm.STALL_FREE]["holds"] == "yes"  # judged at 0.5 req/s only
    assert rows[versus_vllm.STALL_FREE]["ours"].endswith("qps 1: on 120 ms, off left out (no finished run)")


def test_the_figure_names_its_engines_scale_seeds_and_machine():
    import matplotlib.pyplot as plt

    fig = versus_vllm.figure(versus_vllm.named(_runs(TBT)))
    title = fig._suptitle.get_text()
    for said in ("measured on CPU (a CPU, 2 threads, float32)", "seeds 0, 1", "sarathi_lab abcdef0", "vLLM 0.32.0",
                 "2.99x at 0.5 req/s"):
        assert said in title, said
    assert [ax.get_title() for ax in fig.axes[:3]] == ["TTFT: p50 (marked), p99 (faint)", "P99 TBT (itl_p99_s)",
                                                       "throughput (prompt + generated tokens)"]
    plt.close(fig)


def test_a_root_without_both_engines_is_refused_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", "versus_vllm", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=False)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: root {tmp_path} is invalid")


def test_a_capacity_search_is_a_task_vllm_runs(monkeypatch):
    monkeypatch.setattr(vllm_args, "vllm_version", lambda: "0.32.0")
    plan = plan_engine(EngineConfig(model="tiny", scheduler="sarathi_serve", executor="vllm", device="cpu",
                                    dtype="float32", max_model_len=256, num_kv_blocks=40))
    vllm_args.check_vllm(plan)
    assert task_refusal("vllm", "capacity") is None


def _run(tmp_path, *overrides: str, multirun: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")} | {"XDG_CACHE_HOME": str(tmp_path)}
    # Eager: vLLM's compile at start-up costs minutes on a CPU and is no part of what these check.
    return subprocess.run([sys.executable, "-m", "sarathi_lab.run", *(["-m"] if multirun else []), "experiment=smoke",
                           "logger=none", "engine.cuda_graphs=false", *overrides], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900, check=False)


@NEEDS_VLLM
@pytest.mark.e2e
def test_a_sweep_over_both_engines_runs_and_draws(tmp_path):
    done = _run(tmp_path, "executor=model,vllm", "scheduler=sarathi_serve", "workload.qps=4",
                f"hydra.sweep.dir={tmp_path}/sweep", multirun=True)
    assert done.returncode == 0, done.stderr[-3000:]
    table = pd.read_csv(tmp_path / "sweep" / "sweep_summary.csv")
    assert sorted(table.executor) == ["model", "vllm"]
    written = versus_vllm.publish(tmp_path / "sweep", tmp_path / "docs")
    assert all(p.stat().st_size > 0 for p in written)
    claims = pd.read_csv(tmp_path / "docs" / "figures" / "versus_vllm_claims.csv", keep_default_na=False)
    # One scheduler only: nothing to compare, so nothing judged.
    assert claims.holds.tolist() == ["n/a", "n/a"]


@NEEDS_VLLM
@pytest.mark.e2e
def test_a_capacity_search_runs_on_vllm(tmp_path):
    done = _run(tmp_path, "task=capacity", "executor=vllm", "scheduler=sarathi_serve", "workload.arrival=poisson",
                "workload.num_requests=8", "capacity.start_qps=2", "capacity.max_trials=2", "capacity.trial_s=2",
                "capacity.min_requests=4", f"hydra.run.dir={tmp_path}/run")
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "run" / "capacity.json").read_text())
    assert len(record["trials"]) == 2
    trial = json.loads(next((tmp_path / "run").glob("trial-0-*/metrics.json")).read_text())
    assert trial["environment"]["executor"] == "vllm" and trial["summary"]["num_requests"] == 4
