"""The same config and seed give the same tokens and the same batch composition, run after run."""
from __future__ import annotations

import pytest

from sarathi_lab import LLM, SamplingParams
from sarathi_lab.engine.scheduler import scheduler_names

PROMPTS = [[7] * 30, [3, 1, 4, 1, 5, 9, 2, 6], [11] * 17, [2] * 3]


def _run(scheduler: str, sampling: SamplingParams | None):
    llm = LLM("tiny", scheduler=scheduler, chunk_size=12, max_batch_size=3, device="cpu", dtype="float32",
              warmup_iters=0, seed=5)
    tokens = llm.generate(PROMPTS, max_new_tokens=[5, 9, 4, 7], sampling=sampling)
    shapes = [(i.num_prefill_tokens, i.num_decode_tokens, i.num_prefill_requests, i.num_decode_requests,
               i.kv_tokens_read) for i in llm.metrics.iterations]
    return tokens, shapes


@pytest.mark.parametrize("scheduler", scheduler_names())
def test_same_seed_same_tokens_and_batches(scheduler):
    assert _run(scheduler, None) == _run(scheduler, None)


def test_sampling_is_seeded_and_not_greedy():
    seeded = SamplingParams(temperature=1.5, top_p=0.9, seed=3)
    first, _ = _run("sarathi", seeded)
    assert first == _run("sarathi", seeded)[0]
    assert first != _run("sarathi", SamplingParams(temperature=1.5, top_p=0.9, seed=4))[0]
    assert first != _run("sarathi", None)[0]


def test_top_p_keeps_only_the_nucleus():
    import torch

    from sarathi_lab.model.sampler import _top_p
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert _top_p(probs, 0.7)[0].tolist() == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0])
    assert _top_p(probs, 0.01).tolist() == [[1.0, 0.0, 0.0, 0.0]]
