"""A prompt prefilled in chunks gives the logits of the same prompt prefilled at once."""
from __future__ import annotations

import pytest
import torch

from sarathi_lab import LLM
from sarathi_lab.engine.batch import ScheduledBatch, ScheduledChunk
from sarathi_lab.engine.sequence import Sequence

PROMPT_LEN = 45


def _prefill_logits(llm: LLM, prompt: list[int], chunk: int, seq_id: int) -> torch.Tensor:
    """Every position's logits, computing the prompt ``chunk`` tokens at a time through the cache."""
    runner, blocks = llm.engine.executor.runner, llm.block_manager
    seq = Sequence(seq_id, prompt, max_new_tokens=1)
    rows = []
    while seq.num_computed < len(prompt):
        n = min(chunk, len(prompt) - seq.num_computed)
        blocks.allocate(seq, n)
        prepared = runner.prepare(ScheduledBatch(prefills=[ScheduledChunk(seq, n)]))
        every_row = torch.arange(n)
        with torch.inference_mode():
            rows.append(runner.model(prepared.input_ids, prepared.positions, runner.kv_caches, prepared.meta,
                                     every_row))
        seq.num_computed += n
    blocks.free(seq)
    return torch.cat(rows)


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", device="cpu", dtype="float32", warmup_iters=0)


@pytest.mark.parametrize("chunk", [1, 7, 16, PROMPT_LEN + 10])
def test_chunked_logits_equal_whole_prefill(llm, chunk):
    prompt = torch.randint(0, llm.model_config.vocab_size, (PROMPT_LEN,)).tolist()
    whole = _prefill_logits(llm, prompt, PROMPT_LEN, seq_id=0)
    chunked = _prefill_logits(llm, prompt, chunk, seq_id=1)
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-5)
