"""Greedy generation of the engine equals transformers' own, for every architecture and scheduler."""
from __future__ import annotations

import pytest
import torch

from sarathi_lab import LLM
from sarathi_lab.engine.scheduler import scheduler_names
from tests.hf_models import CONFIGS, hf_greedy, save_random_model

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
