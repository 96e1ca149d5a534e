"""A prompt prefilled in chunks gives the logits of the same prompt prefilled at once."""
from __future__ import annotations

import pytest
import torch

from sarathi_lab import LLM
from sarathi_lab.engine.batch import ScheduledBatch, ScheduledChunk
from sarathi_lab.engine.sequence import Sequence
from sarathi_lab.model.runner import batch_tensors

PROMPT_LEN = 45


def _prefill_logits(llm: LLM, prompt: list[int], chunk: int, seq_id: int, reserve: int = 0) -> torch.Tensor:
    """Every position's logits, computing the prompt ``chunk`` tokens at a time through the cache,
    after taking the blocks of ``reserve`` tokens up front as orca and static do."""
    runner, blocks = llm.engine.executor.runner, llm.block_manager
    seq = Sequence(seq_id, prompt, max_new_tokens=1)
    blocks.allocate(seq, reserve)
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


def test_the_attention_reads_only_the_cached_blocks_of_a_reservation():
    # orca and static hold the blocks of max_model_len tokens from admission; the block tables the
    # forward pass gets stop at each request's context, as wide as the longest one.
    chunk = Sequence(0, [1] * 6, 2, block_table=[9, 8, 7, 6, 5])
    decode = Sequence(1, [2] * 3, 4, num_computed=2, block_table=[4, 3, 2, 1, 0])
    batch = ScheduledBatch(prefills=[ScheduledChunk(chunk, 6)], decodes=[decode])
    meta = batch_tensors(batch, 4, torch.device("cpu")).meta
    assert meta.block_tables.tolist() == [[9, 8], [4, 0]]
    assert meta.slot_mapping.tolist() == [36, 37, 38, 39, 32, 33, 18]


def test_a_reserved_block_table_gives_the_logits_of_a_paged_one(llm):
    prompt = torch.randint(0, llm.model_config.vocab_size, (PROMPT_LEN,)).tolist()
    paged = _prefill_logits(llm, prompt, 16, seq_id=0)
    torch.testing.assert_close(_prefill_logits(llm, prompt, 16, seq_id=1, reserve=llm.max_model_len), paged,
                               rtol=0, atol=0)
