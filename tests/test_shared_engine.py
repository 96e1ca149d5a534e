"""A sweep's jobs share one engine (model/shared_engine.py): the weights built once and drawn again in
place for another seed, the KV cache reused while large enough, rotary tables per context, CUDA graphs
per set of shapes. Each job's results must be a fresh engine's: the same weights bit for bit, the same
greedy tokens and iterations, and on the simulator the same bytes. The references are engines built
afresh by the same code (build_model, LLM), which the sharing only skips."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from sarathi_lab import LLM
from sarathi_lab.attention import make_backend
from sarathi_lab.config import EngineConfig
from sarathi_lab.harness import runner
from sarathi_lab.model import build_model, cuda_graphs, load_config
from sarathi_lab.model.cpu_linear import PackedLinear
from sarathi_lab.model.loader import reseed, rotary_for
from sarathi_lab.model.shared_engine import ModelKey, SharedEngine
from sarathi_lab.plan import plan_engine
from tests.test_cuda_graphs import replayed_capture

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
PROMPTS = [[i + 3] * (10 + 13 * i) for i in range(4)]
# What an iteration is, as the scheduler made it: a shared engine's must be a fresh one's.
SHAPE = ("num_prefill_tokens", "num_decode_tokens", "prefill_chunk_tokens", "decode_request_ids",
         "num_preempted", "num_kv_blocks_used")


def _model(seed: int, cpu_linear: str = "auto", dtype: torch.dtype = torch.float32,
           max_positions: int = 128):
    return build_model("tiny", load_config("tiny"), make_backend("torch", CPU), max_positions, dtype,
                       CPU, seed, cpu_linear)


@pytest.mark.parametrize("cpu_linear", ["auto", "aten"])
def test_weights_drawn_again_in_place_are_a_fresh_builds_bit_for_bit(cpu_linear):
    model, fresh = _model(0, cpu_linear), _model(1, cpu_linear)
    addresses = {name: p.data_ptr() for name, p in model.named_parameters()}
    assert reseed(model, "tiny", 1)
    # In place: graphs captured over these tensors read the new weights.
    assert {name: p.data_ptr() for name, p in model.named_parameters()} == addresses
    theirs = dict(fresh.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(p, theirs[name]), name
    # The packed copies (the CPU's GEMMs read them) follow the weights: every row-count path agrees.
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert bool(packed) == (cpu_linear != "aten")
    for rows in (1, 3, 48, 200):
        x = torch.randn(rows, 256)
        assert torch.equal(model.layers[0].self_attn.qkv_proj(x), fresh.layers[0].self_attn.qkv_proj(x))
    ids = torch.tensor([5, 9, 11])
    assert torch.equal(model.embed_tokens(ids), fresh.embed_tokens(ids))


def test_a_checkpoints_weights_are_not_drawn():
    model = _model(0)
    before = [p.clone() for p in model.parameters()]
    assert not reseed(model, "/some/checkpoint", 1)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("positions", [64, 100, 2048])
def test_rotary_tables_for_a_context_are_a_fresh_builds(positions):
    rotary = _model(0, max_positions=positions).layers[0].self_attn.rotary
    tables = rotary_for(load_config("tiny"), torch.float32, CPU, positions)
    assert torch.equal(tables.cos, rotary.cos) and torch.equal(tables.sin, rotary.sin)


# Jobs of one sweep, in its order: seeds, chunks, batch sizes, contexts, schedulers and KV caches
# that change from one to the next, some back to an earlier value.
JOBS = [{"seed": 0, "chunk_size": 32, "max_batch_size": 4, "max_model_len": 128},
        {"seed": 1, "chunk_size": 64, "max_batch_size": 2, "max_model_len": 128},
        {"seed": 1, "chunk_size": 32, "max_batch_size": 4, "max_model_len": 256, "scheduler": "vllm"},
        {"seed": 0, "chunk_size": 16, "max_batch_size": 8, "max_model_len": 128, "num_kv_blocks": 200},
        {"seed": 2, "chunk_size": 32, "max_batch_size": 3, "max_model_len": 128, "scheduler": "orca"},
        {"seed": 0, "chunk_size": 32, "max_batch_size": 4, "max_model_len": 128}]


def _outcome(llm: LLM) -> tuple:
    tokens = llm.generate(PROMPTS, max_new_tokens=[6, 1, 9, 4])
    shapes = [tuple(getattr(r, k) for k in SHAPE) for r in llm.metrics.iterations]
    return tokens, shapes


def test_a_sweeps_jobs_on_one_shared_engine_give_a_fresh_engines_tokens_and_iterations():
    shared = SharedEngine()
    parts = []
    for job in JOBS:
        cfg = EngineConfig(model="tiny", device="cpu", dtype="float32", **job)
        fresh = _outcome(LLM.from_plan(plan_engine(cfg)))
        llm = LLM.from_plan(plan_engine(cfg), shared)
        assert _outcome(llm) == fresh, job
        weights = dict(LLM.from_plan(plan_engine(cfg)).model.named_parameters())
        assert all(torch.equal(p, weights[n]) for n, p in llm.model.named_parameters()), job
        parts.append(llm.setup["parts"])
        assert llm.setup["warmup"] == {"iterations": 2, "prompt_tokens": job["chunk_size"], "new_tokens": 2}
    assert shared.builds == 1
    assert [p["model"] for p in parts] == ["built", "re-seeded", "reused", "re-seeded", "re-seeded",
                                           "re-seeded"]
    # Rebuilt only to grow (a larger context's requests, the explicit 200 blocks); else reused.
    assert [p["kv_cache"] for p in parts] == ["built", "reused", "built", "built", "reused", "reused"]


def test_another_model_or_linear_layer_is_built_and_release_frees_it():
    shared = SharedEngine()
    for model, cpu_linear in [("tiny", "auto"), ("tiny", "aten"), ("tiny", "aten"), ("cpu-small", "aten")]:
        LLM.from_plan(plan_engine(EngineConfig(model=model, device="cpu", dtype="float32", max_model_len=64,
                                               max_batch_size=2, warmup_iters=0, cpu_linear=cpu_linear)),
                      shared)
    assert shared.builds == 3
    held = shared.held_bytes(CPU)
    # The weights and their packed copies, the cache: counted as free when the next job plans.
    assert held > sum(p.numel() * 4 for p in shared._kept.model.parameters())
    assert shared.held_bytes(torch.device("meta")) == 0
    shared.release()
    assert shared.held_bytes(CPU) == 0


def test_weights_whose_draw_was_cut_short_are_drawn_again_whatever_the_seed(monkeypatch):
    from sarathi_lab.model import loader

    shared = SharedEngine()

    def model(seed: int):
        return shared.model(ModelKey("tiny", "float32", "cpu", "torch", "auto"), load_config("tiny"), seed, 128,
                            make_backend("torch", CPU), lambda: _model(0))

    kept = model(0)
    real = loader.reseed

    def cut_short(lm, name, seed):
        next(lm.parameters()).data.fill_(7.0)  # some weights drawn, then a signal
        raise KeyboardInterrupt

    monkeypatch.setattr(loader, "reseed", cut_short)
    with pytest.raises(KeyboardInterrupt):
        model(1)
    monkeypatch.setattr(loader, "reseed", real)
    # The job after it asks for seed 0 again: its weights are drawn, not taken as they were left.
    assert model(0) is kept and shared.parts["model"] == "re-seeded"
    assert all(torch.equal(a, b) for a, b in zip(kept.parameters(), _model(0).parameters()))


def test_a_gpu_job_plans_from_the_memory_free_before_the_kept_engine_was_built(monkeypatch):
    # No GPU here: the kept model says it is on one, and the free memory read before its build is faked.
    from sarathi_lab.model import memory, shared_engine

    shared = SharedEngine()
    monkeypatch.setattr(shared_engine, "_free_bytes", lambda device: 80 * 10**9 if device == "cuda" else None)
    monkeypatch.setattr(memory, "SHARED", shared)
    key = shared_engine.ModelKey("tiny", "bfloat16", "cuda", "triton", "auto")
    shared.model(key, load_config("tiny"), 0, 128, make_backend("torch", CPU), lambda: _model(0))
    # Every job plans from that figure, whatever the kept engine holds now: a fresh process's.
    assert memory.device_memory_bytes(torch.device("cuda")) == 80 * 10**9
    assert shared.free_before(CPU) is None and shared.held_bytes(torch.device("cuda")) == 0
    shared.release()
    assert shared.free_before(torch.device("cuda")) is None


def test_the_kept_kv_cache_serves_a_plan_naming_its_device_without_an_index():
    # A CUDA tensor says cuda:0 where the plan says cuda: the same device, so the cache (and the graphs
    # captured over it) must not be rebuilt for every job (devices are named without one here).
    from sarathi_lab.model import shared_engine

    assert shared_engine._same_device(torch.device("cuda", 0), torch.device("cuda"))
    assert shared_engine._same_device(torch.device("cuda", 1), torch.device("cuda", 1))
    assert not shared_engine._same_device(torch.device("cuda", 0), torch.device("cuda", 1))
    assert not shared_engine._same_device(torch.device("cpu"), torch.device("cuda"))


def test_a_runs_engine_is_shared_unless_switched_off(monkeypatch):
    from sarathi_lab.harness.compose import compose_config
    from sarathi_lab.harness.schema import parse_config
    from sarathi_lab.model.shared_engine import SHARED

    def shared(*overrides):  # as the runner asks the run's executor kind
        cfg = parse_config(compose_config(["model=tiny", "logger=none", *overrides]))
        return cfg.engine.kind.shared_parts(cfg)

    monkeypatch.delenv(runner.SHARE_ENGINE_ENV, raising=False)
    assert shared() is SHARED
    assert shared("executor=sim") is None  # builds no model
    monkeypatch.setenv(runner.SHARE_ENGINE_ENV, "false")
    assert shared() is None
    monkeypatch.setenv(runner.SHARE_ENGINE_ENV, "sometimes")
    with pytest.raises(Exception, match="SARATHI_SHARE_ENGINE='sometimes' is invalid"):
        shared()
    assert shared("executor=sim") is None  # nor reads the switch


def test_graphs_are_captured_once_per_set_of_shapes_and_replay_a_fresh_engines_tokens(monkeypatch):
    # No CUDA here: graphs are captured with test_cuda_graphs' stand-in, over Triton's interpreter.
    monkeypatch.setattr(cuda_graphs, "can_replay", lambda backend, device: backend.name == "triton")
    monkeypatch.setattr(cuda_graphs, "CudaGraphs", functools.partial(cuda_graphs.CudaGraphs,
                                                                     capture=replayed_capture))
    shared = SharedEngine()

    def engine(seed: int, batch: int, share: bool) -> LLM:
        cfg = EngineConfig(model="tiny", device="cpu", dtype="float32", attention="triton", cpu_linear="aten",
                           max_batch_size=batch, max_model_len=64, chunk_size=16, warmup_iters=0, seed=seed)
        return LLM.from_plan(plan_engine(cfg), shared if share else None)

    first = engine(0, 4, True)
    graphs = first.engine.executor.graphs
    assert graphs is not None and not first.cuda_graphs["kept"]
    prompts = [[3] * 20, [5] * 9]
    tokens = {}
    for seed, batch in [(1, 4), (1, 2), (0, 4)]:
        llm = engine(seed, batch, True)
        kept = (batch == 4)
        assert (llm.engine.executor.graphs is graphs) == kept and llm.cuda_graphs["kept"] == kept
        assert llm.setup["parts"]["cuda_graphs"] == ("reused" if kept else "captured")
        tokens[seed, batch] = llm.generate(prompts, max_new_tokens=3)
        assert tokens[seed, batch] == engine(seed, batch, False).generate(prompts, max_new_tokens=3)
    assert shared.builds == 1


def _sweep(sweep_dir: Path, executor: str, share: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env[runner.SHARE_ENGINE_ENV] = "true" if share else "false"
    return subprocess.run([sys.executable, "-m", "sarathi_lab.run", "-m", "seed=0,1", "chunk=32,64",
                           f"executor={executor}", "model=tiny", "logger=none", "seq_len=96", "pd_ratio=5",
                           f"hydra.sweep.dir={sweep_dir}"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)


# What differs between two runs of one config whoever runs them: the clock and the machine's load.
WALL_CLOCK = {"wall_time_s", "runqueue_wait_share", "load1_start", "load1_end", "timing_unreliable",
              "timing_note", "seconds", "time"}


def _without_wall_clock(record):
    if isinstance(record, dict):
        return {k: _without_wall_clock(v) for k, v in record.items() if k not in WALL_CLOCK}
    return record


@pytest.mark.e2e
@pytest.mark.parametrize("executor", ["model", "sim"])
def test_a_sweep_run_both_ways_records_the_same(tmp_path, executor):
    shared, fresh = (_sweep(tmp_path / name, executor, share) for name, share in
                     [("shared", True), ("fresh", False)])
    assert shared.returncode == fresh.returncode == 0, (shared.stderr + fresh.stderr)[-3000:]
    # One build for the sweep's four jobs; a simulated run builds none.
    builds = {"model": (1, 4), "sim": (0, 0)}[executor]
    logs = [run.stdout + run.stderr for run in (shared, fresh)]
    assert tuple(log.count("engine: built model") for log in logs) == builds
    jobs = sorted(p.name for p in (tmp_path / "shared").iterdir() if p.is_dir())
    assert len(jobs) == 4
    for job in jobs:
        a, b = tmp_path / "shared" / job, tmp_path / "fresh" / job
        records = [json.loads((d / "metrics.json").read_text()) for d in (a, b)]
        setups = [r["environment"].pop("engine_setup") for r in records]
        if executor == "sim":
            assert _without_wall_clock(records[0]) == _without_wall_clock(records[1])
            # Virtual-clock times: every table the same bytes.
            for table in ("iterations.parquet", "requests.parquet"):
                assert (a / table).read_bytes() == (b / table).read_bytes(), (job, table)
            continue
        for key in ("config", "resolved_config", "overrides", "inputs"):
            assert records[0][key] == records[1][key], (job, key)
        counts = ("num_requests", "num_iterations", "kv_tokens_read", "kv_capacity_tokens", "num_preemptions")
        assert [{k: r["summary"].get(k) for k in counts} for r in records] == [
            {k: records[1]["summary"].get(k) for k in counts}] * 2
        assert setups[1]["parts"] == {"model": "built", "kv_cache": "built"}
        # Seeds vary slowest: the weights drawn again once, for seed 1.
        index = int(job.split("_")[0])
        assert setups[0]["parts"]["model"] == ["built", "reused", "re-seeded", "reused"][index]
        shapes = [pd.read_parquet(d / "iterations.parquet")[list(SHAPE)].astype(str) for d in (a, b)]
        pd.testing.assert_frame_equal(*shapes)
        lengths = [pd.read_parquet(d / "requests.parquet")[["prompt_tokens", "output_tokens", "num_preemptions"]]
                   for d in (a, b)]
        pd.testing.assert_frame_equal(*lengths)
