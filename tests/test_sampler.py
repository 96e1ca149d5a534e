"""Greedy sampling picks the first index of each row's maximum, ties included, in every dtype; sampling
follows softmax(logits / temperature) cut to the top-p nucleus."""
import math
from contextlib import nullcontext
from unittest.mock import patch

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sarathi_kernels import cpu_ops

from sarathi_lab.engine.sequence import SamplingParams
from sarathi_lab.model.sampler import Sampler

# The CPU's sampling paths: the kernels' (csrc/nucleus_cpu.cpp for top-p) and torch's, which CUDA
# and a machine without a compiler run.
KERNELS = cpu_ops.supports(torch.zeros(1))
PATHS = ["kernels", "torch"] if KERNELS else ["torch"]


def _path(name: str):
    return nullcontext() if name == "kernels" else patch.object(cpu_ops, "supports", lambda x: False)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 6), vocab=st.integers(1, 300), levels=st.integers(1, 4),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), seed=st.integers(0, 2**16))
def test_greedy_is_the_first_index_of_the_maximum(rows, vocab, levels, dtype, seed):
    # Few distinct values, so that most rows hold their maximum several times.
    g = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, levels, (rows, vocab), generator=g).to(dtype)
    got = Sampler(SamplingParams(temperature=0.0))(logits)
    want = [next(i for i, v in enumerate(row) if v == max(row)) for row in logits.float().tolist()]
    assert got == want


def test_greedy_ties_at_vocab_size_take_the_first():
    # At a real vocabulary the reduction runs vectorized, in several lanes and threads.
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.zeros(16, 32000, dtype=dtype)
        for r in range(16):
            first = 1000 * r + 7
            logits[r, [first, first + 15, 31999 - r]] = 3.0
        got = Sampler(SamplingParams(temperature=0.0))(logits)
        assert got == [1000 * r + 7 for r in range(16)]


# Around the kernel's groups (128 float32 / 256 bfloat16 elements) and its tails, and a real vocabulary.
VOCABS = [1, 7, 127, 128, 129, 256, 257, 300, 32000]


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 20), vocab=st.sampled_from(VOCABS), seed=st.integers(0, 2**16),
       specials=st.lists(st.sampled_from([float("inf"), float("-inf"), float("nan")]), max_size=6),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_greedy_equals_torch_argmax_with_infinities_and_nan(rows, vocab, seed, specials, dtype):
    # The CPU path runs its own kernel (-ffast-math), so the values fast math may assume away are
    # held to torch's answer too: NaN wins (its first index), then +inf, and -inf only where all are.
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g)
    for value, at in zip(specials, torch.randint(0, rows * vocab, (len(specials),), generator=g).tolist()):
        logits.view(-1)[at] = value
    if seed % 5 == 0:
        logits[0] = float("-inf")
    logits = logits.to(dtype)
    got = Sampler(SamplingParams(temperature=0.0))(logits)
    assert got == logits.argmax(dim=-1).tolist()


def _tempered_nucleus(logits: list[float], temperature: float, top_p: float) -> list[float]:
    """The distribution sampling must follow, in plain Python: softmax(logits / T), then only the most
    likely tokens until their mass reaches top_p (the one that crosses it included), renormalised."""
    weights = [math.exp(x / temperature) for x in logits]
    probs = [w / sum(weights) for w in weights]
    kept, mass = [0.0] * len(probs), 0.0
    for i in sorted(range(len(probs)), key=lambda i: -probs[i]):
        if mass >= top_p:
            break
        kept[i], mass = probs[i], mass + probs[i]
    return [p / sum(kept) for p in kept]


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.5, 1.0), (2.0, 1.0), (1.0, 0.6), (0.7, 0.9)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("along", ["requests", "positions"])
def test_sampling_frequencies_follow_the_tempered_nucleus(temperature, top_p, dtype, along):
    # 40000 draws of one row: each frequency within ~0.0025 (one standard deviation) of its probability,
    # so a sampler that ignored the temperature (0.2 or more off) or cut the nucleus one token early or
    # late fails by far. The draws are keyed by 40000 requests at one position, or by one request's
    # 40000 positions: both must be uniform. Seeded: the same draws every run, never flaky.
    logits = [3.0, 2.0, 1.5, 0.0, -1.0, -4.0]
    want = _tempered_nucleus(logits, temperature, top_p)
    rows = torch.tensor(logits, dtype=dtype).repeat(40000, 1)
    keys = [(i, 0) if along == "requests" else (0, i) for i in range(len(rows))]
    got = Sampler(SamplingParams(temperature=temperature, top_p=top_p, seed=0))(rows, keys)
    freq = [got.count(i) / len(got) for i in range(len(logits))]
    assert all(f == 0 for f, p in zip(freq, want) if p == 0), (freq, want)
    assert max(abs(f - p) for f, p in zip(freq, want)) < 0.012, (freq, want)


@pytest.mark.parametrize("temperature", [1e-38, 5e-324])
def test_a_tiny_temperature_samples_the_maximum(temperature):
    # SamplingParams accepts any finite temperature > 0; logits / T overflowed to inf and softmax to
    # NaN, and multinomial raised mid-run. In the limit T -> 0 sampling is greedy.
    logits = torch.tensor([[10.0, 3.0, -2.0], [1.0, 5.0, 2.0]])
    assert Sampler(SamplingParams(temperature=temperature, seed=0))(logits, [(0, 0), (1, 0)]) \
        == [0, 1]


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 12), vocab=st.sampled_from([2, 7, 300, 32000]), seed=st.integers(0, 2**16),
       top_p=st.sampled_from([1.0, 0.9, 0.3]))
def test_a_rows_token_depends_on_its_own_logits_and_key_only(rows, vocab, seed, top_p):
    # Rows shuffled, or sampled beside other rows or alone, draw the same token: what lets a request's
    # tokens be the same under every scheduler (test_determinism).
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 3
    keys = [(seed + 3 * r, r % 4) for r in range(rows)]
    sampler = Sampler(SamplingParams(temperature=1.0, top_p=top_p, seed=seed))
    together = sampler(logits, keys)
    order = torch.randperm(rows, generator=g).tolist()
    assert sampler(logits[order], [keys[i] for i in order]) == [together[i] for i in order]
    assert [sampler(logits[r:r + 1], keys[r:r + 1])[0] for r in range(rows)] == together


@pytest.mark.parametrize("u, want", [(0.0, 1), (1 - 2**-24, 3)])
@pytest.mark.parametrize("top_p", [1.0, 0.5])
def test_zero_probability_tokens_are_never_drawn_at_the_uniforms_ends(monkeypatch, u, want, top_p):
    # -inf logits sit before, between and after the live ones; u * mass may round up to the mass itself.
    import sarathi_lab.model.sampler as sampler_module
    monkeypatch.setattr(sampler_module, "uniform", lambda *key: u)
    logits = torch.tensor([[float("-inf"), 1.0, float("-inf"), 1.5, float("-inf")]])
    got = Sampler(SamplingParams(temperature=1.0, top_p=top_p, seed=1))(logits, [(0, 0)])
    assert got == [3 if top_p == 0.5 else want]  # the nucleus of 0.5 holds token 3 alone


def test_sampling_without_keys_is_refused():
    with pytest.raises(ValueError, match="one .request, position. key per row: 2 rows, keys None"):
        Sampler(SamplingParams(temperature=1.0))(torch.zeros(2, 5))


@settings(max_examples=80, deadline=None)
@given(rows=st.integers(1, 6), vocab=st.sampled_from([1, 2, 300, 5000, 32000]),
       scale=st.sampled_from([0.5, 4.0, 12.0, 60.0]), top_p=st.sampled_from([0.5, 0.9, 0.99, 1.0]),
       temperature=st.sampled_from([0.6, 1.0, 1.5]), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       seed=st.integers(0, 2**16), tied=st.booleans(), path=st.sampled_from(PATHS))
# Two of the 5000 random logits equal: topk and an unstable sort ordered them as they pleased.
@example(rows=5, vocab=5000, scale=0.5, top_p=0.99, temperature=1.0, dtype=torch.float32, seed=751, tied=False,
         path="torch")
# Two logits one float32 ulp apart (tokens 2357 and 1242 of row 3) whose weights the kernel rounded to
# one value and ordered as a tie: the less likely token was drawn (found on a Xeon's avx512-vnni build).
@example(rows=4, vocab=5000, scale=0.5, top_p=0.9, temperature=1.0, dtype=torch.float32, seed=457, tied=False,
         path="kernels")
def test_sampling_draws_the_token_a_plain_inverse_cdf_does(rows, vocab, scale, top_p, temperature, dtype, seed, tied,
                                                            path):
    # Each row must draw what its own inverse CDF, in plain Python over float64, gives for the same
    # uniform: over the tokens in id order at top_p 1, else over the nucleus in descending
    # probability, tokens of equal probability in id order (Python's sort is stable). On torch's path
    # peaked rows (scale 12) find their nucleus among the top 64, flatter ones among 1024 or by a
    # full sort; the kernel selects by the weights' bits (scale 60: most of them underflow to 0 or to
    # subnormals). Tied: logits on a grid of halves, so that ties straddle the nucleus' end and topk's k-th.
    import sarathi_lab.model.sampler as sampler_module
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * scale
    if tied:
        logits = (logits * 2).round() / 2
    logits = logits.to(dtype)
    keys = [(r, seed) for r in range(rows)]
    with _path(path):
        got = Sampler(SamplingParams(temperature=temperature, top_p=top_p, seed=seed))(logits, keys)
    probs = torch.softmax(logits.double() / temperature, dim=-1).tolist()
    for row, p, (request, position) in zip(got, probs, keys):
        order = range(vocab) if top_p == 1 else sorted(range(vocab), key=lambda i: -p[i])
        nucleus, mass, masses = [], 0.0, []
        for i in order:
            if top_p < 1 and mass >= top_p:
                break
            nucleus.append(i)
            mass += p[i]
            masses.append(mass)
        target = sampler_module.uniform(seed, request, position) * mass
        want = next(i for i, m in zip(nucleus, masses) if m > target or i == nucleus[-1])
        # Where float32's rounding could decide (the cut or the draw within 1e-5 of a boundary), the
        # reference in float64 is no judge.
        if min(abs(m - x) for m in masses for x in (target, top_p)) > 1e-5:
            assert row == want


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("top_p", [0.5, 0.75, 1 - 2**-20, 1.0])
def test_a_flat_rows_nucleus_and_draw_are_exact(path, top_p, monkeypatch):
    # 1024 equal logits: each probability is 2^-10 exactly, every running mass exact in float32 and
    # float64, so the nucleus is the first ceil(1024 top_p) tokens in id order (ties) and a draw of u
    # is token floor(u * that many): no rounding for either path to hide behind.
    import sarathi_lab.model.sampler as sampler_module
    size = math.ceil(1024 * top_p)
    logits = torch.zeros(1, 1024)
    for u in (0.0, 0.3, 0.5, 0.999, 1 - 2**-24):
        monkeypatch.setattr(sampler_module, "uniform", lambda *key, u=u: u)
        with _path(path):
            got = Sampler(SamplingParams(temperature=1.0, top_p=top_p, seed=0))(logits, [(0, 0)])
        assert got == [math.floor(u * size)], (u, size)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("top_p", [1.0, 0.9])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "all -inf"])
def test_a_row_without_a_distribution_is_refused_in_one_line(path, top_p, bad):
    # It used to fail inside torch (index -1 out of bounds), or return the vocabulary's size as a token.
    logits = torch.randn(3, 50)
    if bad == "all -inf":
        logits[1] = float("-inf")
    else:
        logits[1, 7] = bad
    with _path(path), pytest.raises(ValueError, match=r"^sampling: logits rows \[1\] hold NaN or \+inf, or only -inf"):
        Sampler(SamplingParams(temperature=1.0, top_p=top_p, seed=0))(logits, [(0, 0), (1, 0), (2, 0)])


@pytest.mark.skipif(not KERNELS, reason="the CPU kernels did not build here")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_sampling_kernel_leaves_rows_without_a_distribution_to_its_caller(dtype):
    ok = torch.randn(2, 40, dtype=dtype)
    for top_p in (1.0, 0.9):
        assert cpu_ops.sample(ok, 1.0, top_p, [0.5, 0.5]) is not None
        for bad in (float("nan"), float("inf")):
            logits = ok.clone()
            logits[1, 3] = bad
            assert cpu_ops.sample(logits, 1.0, top_p, [0.5, 0.5]) is None, bad
        logits = ok.clone()
        logits[0] = float("-inf")
        assert cpu_ops.sample(logits, 1.0, top_p, [0.5, 0.5]) is None


@pytest.mark.parametrize("path", PATHS)
def test_the_nucleus_orders_logits_one_ulp_apart_as_the_logits_do(path, monkeypatch):
    # 64 float32 logits one ulp apart, in ascending order: their weights round to a few values, but
    # the exact probabilities are distinct, so the nucleus runs from the last token down and a draw of
    # u is the token at floor(u * 64) places from the top (equal masses to float32's rounding).
    import sarathi_lab.model.sampler as sampler_module
    logits = torch.full((1, 64), 0.887)
    for i in range(1, 64):
        logits[0, i] = torch.nextafter(logits[0, i - 1:i], torch.tensor(1.0))
    assert len(set(logits[0].tolist())) == 64
    for u in (0.01, 0.3, 0.52, 0.97):
        monkeypatch.setattr(sampler_module, "uniform", lambda *key, u=u: u)
        with _path(path):
            got = Sampler(SamplingParams(temperature=1.0, top_p=1 - 2**-20, seed=0))(logits, [(0, 0)])
        assert got == [63 - math.floor(u * 64)], u
