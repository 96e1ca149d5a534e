"""Tensor parallelism across real processes (two ranks, gloo on 127.0.0.1): the greedy tokens of the
single-process engine under every scheduler, transformers' own tokens from a checkpoint whose one KV
head every rank replicates, and a rank that dies ending the run with an error that names it. The
ranks are spawned once and serve every engine of this file. Pipelines: test_pipeline_ranks.py."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from sarathi_lab import LLM, SamplingParams
from sarathi_lab.engine.scheduler import scheduler_names
from sarathi_lab.host_features import usable_cores
from sarathi_lab.measure.bench import tp_wire
from sarathi_lab.model.parallel import driver, spawn
from sarathi_lab.model.parallel.group import free_port
from tests.hf_models import hf_greedy

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(usable_cores() < 2, reason="two ranks need two cores")]

PROMPTS = [[7] * 30, [3, 1, 4, 1, 5, 9, 2, 6], [11] * 17, [2] * 3]
NEW = [5, 9, 4, 7]
SETTINGS = {"chunk_size": 12, "max_batch_size": 3, "device": "cpu", "dtype": "float32", "warmup_iters": 0,
            "seed": 5, "num_threads": 1, "collective_timeout_s": 30}


@pytest.mark.parametrize("scheduler", scheduler_names())
def test_two_ranks_give_the_single_process_engines_tokens(scheduler):
    want = LLM("tiny", scheduler=scheduler, **SETTINGS).generate(PROMPTS, NEW)
    llm = LLM("tiny", scheduler=scheduler, tensor_parallel=2, **SETTINGS)
    assert llm.generate(PROMPTS, NEW) == want
    # Every iteration's batch went to the other rank, each send timed.
    assert len(llm.engine.executor.broadcast_s) == len(llm.metrics.iterations)


def test_sampled_tokens_and_preemptions_are_the_single_process_engines():
    sampling = SamplingParams(temperature=1.5, top_p=0.9, seed=11)
    tight = {**SETTINGS, "num_kv_blocks": 4, "block_size": 16}
    prompts = [[(7 * i + 3 * j) % 4000 for j in range(n)] for i, n in enumerate([40, 9, 23, 3, 17])]
    new = [6, 30, 5, 40, 25]
    want = LLM("tiny", **tight).generate(prompts, new, sampling=sampling)
    llm = LLM("tiny", tensor_parallel=2, **tight)
    assert llm.generate(prompts, new, sampling=sampling) == want
    assert llm.metrics.summary()["num_preemptions"] > 0


def test_a_checkpoint_with_one_kv_head_gives_transformers_tokens(tmp_path):
    # One KV head for two ranks (replicated on both), q/k/v biases (Qwen2), a tied LM head cut by vocabulary.
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=512,
                         tie_word_embeddings=True, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    config.architectures = ["Qwen2ForCausalLM"]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)  # wide logits, far from ties; biases too, so that their shards are checked
    model.save_pretrained(tmp_path, safe_serialization=True)
    prompts = [[5, 17, 300, 2, 9], [44] * 13]
    want = [hf_greedy(model, p, 6) for p in prompts]
    llm = LLM(str(tmp_path), tensor_parallel=2, **SETTINGS)
    assert llm.generate(prompts, 6) == want
    assert LLM(str(tmp_path), pipeline_parallel=2, **SETTINGS).generate(prompts, 6) == want


def test_the_broadcast_benchmark_times_every_iteration_kind(capsys):
    table = tp_wire.main(["--requests", "2", "--new-tokens", "3", "--prompt", "16"])
    assert list(table["kind"]) == ["decode", "hybrid", "prefill"] and (table["broadcast_ms_p50"] > 0).all()
    assert list(table["decodes_p50"]) == [2, 1, 0] and table["broadcast_share_p50"].between(0, 1).all()
    # Two decodes: the header (10 int64s); ids, positions, slots and sampled rows (int64, 16 bytes each);
    # rows' starts (3 int32s), context lengths (2), block tables (2 x 2 blocks), each padded to 16 bytes.
    assert table.set_index("kind").loc["decode", "payload_bytes"] == 80 + 4 * 16 + 3 * 16
    assert "broadcast" in capsys.readouterr().out


# A dead or hung rank, in each layout the ranks serve: tensor parallelism's broadcast, a pipeline's
# point-to-point chain; the error names the layout as the run set it.
LAYOUTS = [pytest.param({"tensor_parallel": 2}, "tensor_parallel=2", id="tp2"),
           pytest.param({"pipeline_parallel": 2, "max_model_len": 64}, "tensor_parallel=1 x pipeline_parallel=2",
                        id="pp2")]


@pytest.mark.parametrize(("layout", "named"), LAYOUTS)
def test_a_rank_that_dies_ends_the_run_with_an_error_naming_it(layout, named):
    llm = LLM("tiny", **(SETTINGS | layout))
    rank1 = driver._ranks.processes[0]
    os.kill(rank1.pid, signal.SIGKILL)
    rank1.join(timeout=10)
    with pytest.raises(RuntimeError, match=rf"^{re.escape(named)}: rank 1 \(exit code -9\) died") as e:
        llm.generate(PROMPTS, NEW)
    assert "\n" not in str(e.value)
    assert driver._ranks is None  # given up: the next engine starts its ranks afresh


@pytest.mark.parametrize(("layout", "named", "why"), [
    pytest.param(*LAYOUTS[0].values, " for a rank that died or hangs", id="tp2"),
    pytest.param(*LAYOUTS[1].values, "", id="pp2")])
def test_a_rank_that_hangs_ends_the_run_within_the_collective_timeout(layout, named, why):
    llm = LLM("tiny", **(SETTINGS | layout | {"collective_timeout_s": 3}))
    rank1 = driver._ranks.processes[0]
    os.kill(rank1.pid, signal.SIGSTOP)  # alive, answering nothing
    try:
        with pytest.raises(RuntimeError, match=rf"^{re.escape(named)}: a collective failed or waited longer than "
                                               rf"collective_timeout_s=3{why}"):
            llm.generate(PROMPTS, NEW)
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed already, where the driver gave up on it
            os.kill(rank1.pid, signal.SIGKILL)
    assert driver._ranks is None


@pytest.mark.parametrize(("layout", "named"), LAYOUTS)
def test_a_rank_stopped_after_the_start_ends_the_run_within_the_step_watch_naming_it(layout, named, monkeypatch):
    # Mid-run a stopped rank held the run to collective_timeout_s (here a minute; two by default).
    monkeypatch.setattr(spawn, "STEP_STALL_S", 4.0)
    llm = LLM("tiny", **(SETTINGS | layout | {"collective_timeout_s": 60}))
    rank1 = driver._ranks.processes[0]
    os.kill(rank1.pid, signal.SIGSTOP)  # started and serving: alive, answering nothing
    stopped = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=rf"^{re.escape(named)}: rank 1 stopped mid-step: no rank used CPU "
                                               r"for 4 s, so the run stops$"):
            llm.generate(PROMPTS, NEW)
        assert time.monotonic() - stopped < 20
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rank1.pid, signal.SIGKILL)
    assert driver._ranks is None


def test_a_slow_step_of_a_live_rank_is_no_hang(monkeypatch):
    # The driver's part takes longer than the step watch's window, using CPU all along, while rank 1
    # waits for it without any: the step makes progress, and the run goes on.
    monkeypatch.setattr(spawn, "STEP_STALL_S", 2.0)
    slow, real = [], driver.run_step

    def slow_step(*args):
        if not slow:
            slow.append(time.monotonic())
            while time.monotonic() - slow[0] < 6:  # computing, as a slow part does
                pass
        return real(*args)

    monkeypatch.setattr(driver, "run_step", slow_step)
    want = LLM("tiny", **SETTINGS).generate(PROMPTS, NEW)
    assert LLM("tiny", **(SETTINGS | {"tensor_parallel": 2})).generate(PROMPTS, NEW) == want
    assert slow and driver._ranks is not None and not driver._ranks.stalled


@pytest.mark.slow
def test_torchrun_runs_the_cli_with_rank_0_driving_and_rank_1_serving(tmp_path):
    # torchrun's own variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT): rank 1 never reads the
    # command line; rank 0 runs it and writes the results.
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), "-m", "sarathi_lab.run", "model=tiny", "logger=none",
               "engine.tensor_parallel=2", "device=cpu", "device.num_threads=1", "seq_len=48", "pd_ratio=8",
               "chunk=32", f"hydra.run.dir={tmp_path}"]
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "metrics.json").read_text())["environment"]["tensor_parallel"] == 2
