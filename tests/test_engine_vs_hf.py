"""Greedy generation of the engine equals transformers' own, for every architecture and scheduler."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sarathi_kernels import cpu_ops

from sarathi_lab import LLM
from sarathi_lab.engine.scheduler import scheduler_names
from tests.hf_models import CONFIGS, hf_greedy, save_random_model

ROOT = Path(__file__).resolve().parents[1]
PROMPT_LENS = [37, 5, 16, 61, 1]
NEW_TOKENS = 9


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def reference(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    model = save_random_model(request.param, directory)
    gen = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    expected = [hf_greedy(model, p, NEW_TOKENS) for p in prompts]
    return directory, prompts, expected


# Chunk sizes that do and do not divide the prompt lengths and the block size of 16.
@pytest.mark.parametrize("chunk_size", [7, 16, 64])
@pytest.mark.parametrize("scheduler", scheduler_names())
def test_greedy_matches_transformers(reference, scheduler, chunk_size):
    directory, prompts, expected = reference
    llm = LLM(model=str(directory), scheduler=scheduler, chunk_size=chunk_size, max_batch_size=3,
              device="cpu", dtype="float32", warmup_iters=0)
    assert llm.generate(prompts, max_new_tokens=NEW_TOKENS) == expected


@pytest.mark.skipif(not cpu_ops.supports(torch.zeros(1)), reason="the CPU kernels did not build here")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_tokens_come_from_inside_the_lm_head_and_equal_the_logits_argmax(reference, dtype, monkeypatch):
    # On the CPU every greedy token comes from the LM head's few-row kernel (cpu_ops.linear_argmax)
    # wherever the linear layers run on the kernels (float32 always; bfloat16 not where oneDNN has no
    # bfloat16 and they run as F.linear), and they are the tokens an argmax over its logits gives:
    # transformers' in float32, and in bfloat16 the engine's own with the fused argmax turned off.
    directory, prompts, expected = reference
    llm = LLM(model=str(directory), scheduler="sarathi", chunk_size=16, max_batch_size=3, device="cpu", dtype=dtype,
              warmup_iters=0)
    fuses = llm.model.argmax_rows >= len(prompts)
    assert fuses or dtype == "bfloat16"
    runner = llm.engine.executor.runner
    monkeypatch.setattr(runner, "fuses_argmax", lambda prepared: False)
    unfused = llm.generate(prompts, max_new_tokens=NEW_TOKENS)
    monkeypatch.undo()
    fused_tokens, real = [], cpu_ops.linear_argmax

    def counted(*args):
        tokens = real(*args)
        fused_tokens.extend(tokens)
        return tokens

    monkeypatch.setattr(cpu_ops, "linear_argmax", counted)
    assert llm.generate(prompts, max_new_tokens=NEW_TOKENS) == unfused
    assert len(fused_tokens) == (len(prompts) * NEW_TOKENS if fuses else 0)
    if dtype == "float32":
        assert unfused == expected


# Three requests of 11-13 prompt tokens and 40 new ones need 3 blocks of 16 each; a cache of 5 blocks
# holds one and a half, so every paged scheduler preempts and recomputes prompt + generated tokens;
# orca and static reserve 4 blocks (max_model_len 53) for each and run them one at a time instead.
PREEMPTION = """
import sys
from sarathi_kernels import cpu_attention
from sarathi_lab import LLM
from sarathi_lab.engine.scheduler import scheduler_class, scheduler_names
from tests.hf_models import hf_greedy, save_random_model

hf = save_random_model("llama", sys.argv[1])
prompts = [[5 + i] * 3 + list(range(40 + i, 48 + 2 * i)) for i in range(3)]
expected = [hf_greedy(hf, p, 40) for p in prompts]
for name in scheduler_names():
    llm = LLM(model=sys.argv[1], scheduler=name, chunk_size=7, max_batch_size=3, device="cpu", dtype="float32",
              warmup_iters=0, block_size=16, num_kv_blocks=5, max_model_len=53)
    assert llm.generate(prompts, max_new_tokens=40) == expected, name
    preempted = llm.metrics.summary()["num_preemptions"] > 0
    assert preempted != scheduler_class(name).reserves_max_model_len, name
print(cpu_attention.available())
"""


@pytest.mark.parametrize("compiler", [True, False], ids=["kernels", "no-compiler"])
def test_preempted_requests_match_transformers_with_and_without_the_cpu_kernels(tmp_path, compiler):
    # A fresh interpreter, as users start one: without a C++ compiler every CPU kernel (attention,
    # fused elementwise ops, few-row linear, argmax) falls back to torch's code, which only this run
    # holds to transformers end to end.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), env.get("PYTHONPATH", "")])
    if not compiler:
        env.update(CXX=str(tmp_path / "no-such-compiler"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", PREEMPTION, str(tmp_path / "model")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [str(compiler)], done.stderr[-3000:]
