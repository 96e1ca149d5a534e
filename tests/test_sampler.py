"""Greedy sampling picks the first index of each row's maximum, ties included, in every dtype."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sarathi_lab.engine.sequence import SamplingParams
from sarathi_lab.model.sampler import Sampler


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 6), vocab=st.integers(1, 300), levels=st.integers(1, 4),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), seed=st.integers(0, 2**16))
def test_greedy_is_the_first_index_of_the_maximum(rows, vocab, levels, dtype, seed):
    # Few distinct values, so that most rows hold their maximum several times.
    g = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, levels, (rows, vocab), generator=g).to(dtype)
    got = Sampler(SamplingParams(temperature=0.0), torch.device("cpu"))(logits)
    want = [next(i for i, v in enumerate(row) if v == max(row)) for row in logits.float().tolist()]
    assert got == want


def test_greedy_ties_at_vocab_size_take_the_first():
    # At a real vocabulary the reduction runs vectorized, in several lanes and threads.
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.zeros(16, 32000, dtype=dtype)
        for r in range(16):
            first = 1000 * r + 7
            logits[r, [first, first + 15, 31999 - r]] = 3.0
        got = Sampler(SamplingParams(temperature=0.0), torch.device("cpu"))(logits)
        assert got == [1000 * r + 7 for r in range(16)]
