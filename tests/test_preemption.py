"""Under a KV cache far smaller than the workload, requests are preempted and recomputed, and the
greedy output is the same as with an ample cache."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sarathi_lab import LLM
from sarathi_lab.engine.scheduler import scheduler_names

BLOCK = 16


@pytest.fixture(scope="module")
def ample():
    return {name: LLM("tiny", scheduler=name, chunk_size=24, max_batch_size=4, device="cpu", dtype="float32",
                      warmup_iters=0, block_size=BLOCK) for name in scheduler_names()}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scheduler=st.sampled_from(scheduler_names()),
       lens=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 24)), min_size=2, max_size=6),
       spare_blocks=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_tiny_cache_gives_same_tokens_as_ample_cache(ample, scheduler, lens, spare_blocks, seed):
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 4096, (p,), generator=gen).tolist() for p, _ in lens]
    new_tokens = [n for _, n in lens]
    expected = ample[scheduler].generate(prompts, max_new_tokens=new_tokens)
    # Room for the largest request alone plus at most three blocks: concurrency forces preemption
    # (orca and static, reserving max_model_len for each request, run fewer at once instead).
    largest = max(p + n for p, n in lens)
    blocks = -(-largest // BLOCK) + spare_blocks
    tight = LLM("tiny", scheduler=scheduler, chunk_size=24, max_batch_size=4, device="cpu", dtype="float32",
                warmup_iters=0, block_size=BLOCK, num_kv_blocks=blocks, max_model_len=largest)
    assert tight.generate(prompts, max_new_tokens=new_tokens) == expected
    assert all(r.finish is not None for r in tight.metrics.requests)


def test_preemption_happens_under_pressure():
    # Short prompts, each admitted into one block, whose decodes then grow to 5 blocks each.
    llm = LLM("tiny", scheduler="sarathi", chunk_size=16, max_batch_size=4, device="cpu", dtype="float32",
              warmup_iters=0, block_size=BLOCK, num_kv_blocks=5)
    llm.generate([[1] * 8, [2] * 8, [3] * 8], max_new_tokens=60)
    assert llm.metrics.summary()["num_preemptions"] > 0
