"""executor=vllm: the run's knobs mapped one to one onto vLLM's engine arguments, refusals of what vLLM
cannot express (before any work), and, where vLLM is installed, the same greedy tokens as our engine
on the same weights in float32."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from sarathi_lab.config import ConfigError, EngineConfig, named_as
from sarathi_lab.executors import task_refusal
from sarathi_lab.harness import vllm_args
from sarathi_lab.harness.results import run_source
from sarathi_lab.harness.schema import RUN_KEYS
from sarathi_lab.harness.vllm_args import check_vllm
from sarathi_lab.plan import plan_engine

HAS_VLLM = importlib.util.find_spec("vllm") is not None
NEEDS_VLLM = pytest.mark.skipif(not HAS_VLLM, reason='vLLM is not installed (pip install -e ".[vllm]")')


def _plan(scheduler="sarathi_serve", **kw):
    settings = {"model": "tiny", "scheduler": scheduler, "chunk_size": 48, "max_batch_size": 3, "executor": "vllm",
                "dtype": "float32", "num_kv_blocks": 40, "device": "cpu", "max_model_len": 256} | kw
    return plan_engine(EngineConfig(**settings))


def test_sarathi_serve_is_vllm_with_chunked_prefill_at_the_token_budget():
    args = vllm_args.vllm_args(_plan(), "/m")
    assert args.enable_chunked_prefill and args.max_num_batched_tokens == 48 and args.max_num_seqs == 3
    # The same KV tokens (40 blocks of 16), in the blocks of 32 tokens vLLM-CPU's attention takes.
    assert (args.num_gpu_blocks_override, args.block_size, args.dtype) == (20, 32, "float32")
    odd = vllm_args.vllm_args(_plan(block_size=48, num_kv_blocks=10), "/m")
    assert (odd.block_size, odd.num_gpu_blocks_override) == (96, 5)
    assert (args.max_model_len, args.model, args.enable_prefix_caching) == (256, "/m", False)
    assert vllm_args.vllm_args(_plan(chunk_size=96), "/m").max_num_batched_tokens == 96


def test_vllm_is_vllm_without_chunked_prefill_capped_as_its_knob_says():
    args = vllm_args.vllm_args(_plan("vllm"), "/m")
    # No cap: a full batch of the longest requests fits one prefill iteration.
    assert not args.enable_chunked_prefill and args.max_num_batched_tokens == 256 * 3
    capped = _plan("vllm", scheduler_knobs={"max_num_batched_tokens": 300})
    assert vllm_args.vllm_args(capped, "/m").max_num_batched_tokens == 300


@pytest.mark.parametrize(("kw", "named"), [
    ({"scheduler": "sarathi"}, "scheduler='sarathi' is invalid"),
    ({"scheduler": "orca"}, "scheduler='orca' is invalid"),
    ({"attention": "torch"}, "engine.attention='torch' is invalid"),
    ({"cpu_linear": "aten"}, "engine.cpu_linear='aten' is invalid"),
    ({"kv_watermark": 0.1}, "engine.kv_watermark=0.1 is invalid"),
    ({"tensor_parallel": 2}, "engine.tensor_parallel=2 is invalid"),
    ({"pipeline_parallel": 2}, "engine.pipeline_parallel=2 is invalid"),
    ({"cuda_graphs_mixed": False}, "engine.cuda_graphs_mixed=False is invalid"),
])
def test_what_vllm_cannot_honour_is_refused_in_one_line_by_its_capabilities(kw, named):
    with pytest.raises(ConfigError) as e, named_as(RUN_KEYS):  # the run's edge names the keys
        _plan(**kw)
    assert str(e.value).startswith(named) and "\n" not in str(e.value) and "allowed" in str(e.value)


def test_what_vllm_cannot_run_beyond_its_capabilities_is_refused_in_one_line():
    assert task_refusal("vllm", "profile").startswith("task=profile is invalid with executor=vllm")
    with pytest.raises(ConfigError, match=r"^scheduler.max_num_batched_tokens=100 is invalid.*allowed"):
        check_vllm(_plan("vllm", scheduler_knobs={"max_num_batched_tokens": 100}))


def test_without_vllm_the_refusal_names_the_extra(monkeypatch):
    monkeypatch.setattr(vllm_args, "vllm_version", lambda: None)
    with pytest.raises(ConfigError, match=r'engine.executor=vllm is invalid.*pip install -e "\.\[vllm\]"'):
        check_vllm(_plan())


def test_a_vllm_run_says_so_in_its_source():
    assert run_source({"executor": "vllm", "vllm_version": "0.32.0"}, "cpu") == "measured CPU, vLLM 0.32.0"
    assert run_source({"executor": "vllm"}, "cuda") == "measured GPU, vLLM"
    assert run_source({"executor": "model"}, "cpu") == "measured CPU"


def test_a_sweep_of_both_engines_notes_them_as_engines_and_the_record_names_vllm():
    import pandas as pd

    from sarathi_lab.harness.sweep import table_notes

    notes = table_notes(pd.DataFrame({"source": ["measured CPU", "measured CPU, vLLM 0.32.0"]}))
    assert len(notes) == 1 and "different engines" in notes[0] and "predicted" not in notes[0]
    engine = EngineConfig(executor="vllm", scheduler="sarathi_serve", device="cpu")
    record = engine.kind.record(engine, "cpu")
    assert record["executor"] == "vllm" and not record["simulated"] and "vllm_version" in record
    assert record["vllm_version"] == vllm_args.vllm_version()


CLI_REFUSALS = [("scheduler=orca", "error: scheduler='orca' is invalid with engine.executor='vllm'"),
                ("engine.tensor_parallel=2", "error: engine.tensor_parallel=2 is invalid with engine.executor='vllm'")]
if not HAS_VLLM:
    CLI_REFUSALS.append(("scheduler=sarathi_serve", ('error: engine.executor=vllm is invalid here: vLLM is not '
                                                     'installed; install the extra: pip install -e ".[vllm]"')))


@pytest.mark.parametrize(("scheduler", "line"), CLI_REFUSALS)
def test_the_cli_refuses_before_any_work(tmp_path, scheduler, line):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")} | {"XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "sarathi_lab.run", "experiment=smoke", "executor=vllm", scheduler,
                           "logger=none", f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(line), done.stderr[-2000:]
    assert not (tmp_path / "run" / "metrics.json").exists()


PROMPTS = [[5, 17, 300, 9, 44, 2, 7], list(range(100, 160)), [1], list(range(3000, 3090, 3)), [4095, 0, 12, 12]]
NEW = [6, 9, 4, 7, 5]


@NEEDS_VLLM
@pytest.mark.parametrize("scheduler", ["sarathi_serve", "vllm"])
def test_greedy_tokens_equal_ours_on_the_same_weights(scheduler):
    """Both engines from the same plan's settings: our engine on the preset's seeded weights, vLLM on
    them saved as a checkpoint. Run in a fresh interpreter per scheduler: vLLM's engine holds
    process-wide state that a second engine in the same process would share."""
    code = f"""
import json
from sarathi_lab import LLM, SamplingParams
from sarathi_lab.config import EngineConfig
from sarathi_lab.harness.vllm_engine import VllmLLM
from sarathi_lab.plan import plan_engine
s = dict(model="tiny", scheduler={scheduler!r}, chunk_size=16, max_batch_size=3, dtype="float32", num_kv_blocks=64,
         device="cpu", max_model_len=256, seed=7, num_threads=1, cuda_graphs=False)
greedy = SamplingParams(ignore_eos=True)
ours = LLM(**s).generate({PROMPTS!r}, {NEW!r}, sampling=greedy)
theirs = VllmLLM(plan_engine(EngineConfig(executor="vllm", **s))).generate({PROMPTS!r}, {NEW!r}, sampling=greedy)
import torch
kept = torch.set_num_threads.__name__ == "set_num_threads" and torch.set_num_threads.__module__ == "torch"
print(json.dumps([ours, theirs, kept]))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    ours, theirs, kept = __import__("json").loads(done.stdout.strip().splitlines()[-1])
    assert [len(t) for t in ours] == NEW
    assert theirs == ours
    assert kept, "vLLM's CPU worker left torch.set_num_threads replaced for the rest of the process"


@NEEDS_VLLM
@pytest.mark.e2e
def test_a_run_on_vllm_keeps_the_results_contract(tmp_path):
    """The same tables and metric names as a run of our engine, the version in the environment record."""
    import json

    import pandas as pd

    from sarathi_lab.engine.metrics import Metrics
    from sarathi_lab.harness.results import load_runs

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")} | {"XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "sarathi_lab.run", "experiment=smoke", "executor=vllm",
                           "scheduler=sarathi_serve", "logger=none", "engine.cuda_graphs=false",
                           f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert record["environment"]["executor"] == "vllm" and record["environment"]["vllm_version"]
    assert set(Metrics().summary()) <= set(record["summary"])
    requests = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert len(requests) == 4 and (requests.output_tokens == requests.token_times_s.map(len)).all()
    assert (requests.first_token_s >= requests.arrival_s).all() and (requests.finish_s >= requests.first_token_s).all()
    its = pd.read_parquet(tmp_path / "run" / "iterations.parquet")
    # Every prompt token prefilled once, in batches within the token budget (chunk=64) and the decodes beside.
    assert its.num_prefill_tokens.sum() == requests.prompt_tokens.sum()
    assert (its.num_prefill_tokens + its.num_decode_tokens).max() <= 64
    assert load_runs(tmp_path).executor.tolist() == ["vllm"]
