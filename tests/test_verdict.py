"""analysis/verdict.py: ours against the paper both ways, direction and size."""
from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from sarathi_lab.analysis.verdict import BAND, BOUND, GAIN, SIZE, combine, judge, over, word_of

ORDER = ["no", "smaller", "yes", "larger"]
MIRROR = {"larger": "smaller", "smaller": "larger", "yes": "yes", "no": "no"}
gains = st.floats(min_value=0.01, max_value=1e4, allow_nan=False)
effects = st.floats(min_value=1e-3, max_value=1e4, allow_nan=False)


def _off_the_edges(ours: float, paper: float) -> bool:
    """Away from the band's edges, where the last bit of a division could tip the word."""
    ratio = (ours - 1) / (paper - 1)
    return all(abs(ratio - edge) > 1e-9 * max(1.0, edge) for edge in (1 / BAND, BAND, 0.0))


@pytest.mark.parametrize("ours, paper, word", [
    (440.0, 10.0, "larger"),   # the H200's decode speedup beside Fig. 8's 10x
    (12.36, 3.0, "larger"),    # chunk 64's attention beside the paper's ~3x
    (59.0, 6.29, "larger"),    # a bubble ratio beside Fig. 12's 6.29x
    (1.19, 1.27, "yes"),       # effect 0.19 of the paper's 0.27
    (1.11, 1.23, "smaller"),   # effect 0.11 of 0.23: just under half
    (0.93, 1.144, "no"),       # the other way
    (1.0, 1.27, "no"),         # no effect
])
def test_known_cases(ours, paper, word):
    assert judge(ours, paper).word == word


def test_a_range_is_matched_by_its_nearer_end_and_agrees_inside_it():
    assert judge(5.0, (2.8, 10.0)).versus == 1.0
    assert judge(1.5, (2.8, 10.0)).versus == pytest.approx(0.5 / 1.8)
    assert judge(21.0, (2.8, 10.0)).versus == pytest.approx(20 / 9)
    assert [judge(g, (2.8, 10.0)).word for g in (1.5, 2.0, 19.0, 20.0)] == ["smaller", "yes", "yes", "larger"]


def test_a_size_is_compared_as_it_is():
    assert judge(1024, 512, kind=SIZE).word == "yes" and judge(136, 512, kind=SIZE).word == "smaller"
    assert judge(1024, 512, kind=SIZE).versus == 2.0


@given(paper=gains, low=gains, high=gains)
def test_monotone_in_ours(paper, low, high):
    assume(abs(paper - 1) > 1e-6)
    low, high = sorted((low, high))
    assume(_off_the_edges(low, paper) and _off_the_edges(high, paper))
    if paper > 1:
        assert ORDER.index(judge(low, paper).word) <= ORDER.index(judge(high, paper).word)
    else:  # the paper's effect is a loss: more of a loss is the larger effect
        assert ORDER.index(judge(low, paper).word) >= ORDER.index(judge(high, paper).word)


@given(ours=effects, paper=effects, loss=st.booleans())
def test_symmetric_in_the_band(ours, paper, loss):
    # Swapping ours and the paper swaps larger and smaller and keeps yes: the band is a factor
    # BAND either side. Both gains, or both losses (a ratio below 1, its effect above -1).
    if loss:
        ours, paper = 1 - min(ours, 0.99), 1 - min(paper, 0.99)
    else:
        ours, paper = 1 + ours, 1 + paper
    assume(_off_the_edges(ours, paper))
    there, back = judge(ours, paper), judge(paper, ours)
    assert back.word == MIRROR[there.word]
    assert there.versus * back.versus == pytest.approx(1.0)


@given(ratio=st.floats(min_value=1e-6, max_value=1e6))
def test_the_word_of_a_ratio_is_yes_exactly_within_the_band(ratio):
    assert (word_of(ratio) == "yes") == (1 / BAND <= ratio <= BAND)
    assert word_of(-ratio) == "no"


@given(ours=gains, paper=gains, low=st.floats(min_value=0.01, max_value=1.0),
       high=st.floats(min_value=1.0, max_value=1e4))
def test_a_ratio_whose_spread_reaches_1_is_unresolved(ours, paper, low, high):
    assume(abs(paper - 1) > 1e-6)
    judged = judge(ours, paper, spread=(low, high))
    assert judged.word == "unresolved" and judged.versus is None
    assert combine([judged.word]) == "unclear"
    # Left out beside a judged point: the claim is that point's.
    assert combine([judged.word, "yes"]) == "yes"


@given(ours=gains, paper=gains)
def test_a_spread_that_crosses_the_band_is_unclear_and_one_inside_it_changes_nothing(ours, paper):
    assume(abs(paper - 1) > 1e-3 and abs(ours - 1) > 1e-3 and _off_the_edges(ours, paper))
    alone = judge(ours, paper)
    assert judge(ours, paper, spread=(ours, ours)).word == alone.word
    effect = BAND ** 2 * (paper - 1)  # from half the paper's effect to twice BAND's
    wide = judge(1 + effect, paper, spread=(1 + (paper - 1) / (2 * BAND), 1 + effect))
    assert wide.word == "unclear"


def test_combine_over_points():
    assert combine(["yes", "yes"]) == "yes" and combine(["larger", "larger"]) == "larger"
    assert combine(["yes", "larger"]) == "partly" and combine(["larger", "smaller"]) == "no"
    assert combine(["n/a", "unresolved"]) == "unclear" and combine([]) == "n/a"
    # A length judged partly over its batch sizes holds yes at some of them: the claim is partly.
    assert combine(["partly", "smaller"]) == "partly" and combine(["partly", "no"]) == "partly"
    point = over([judge(5.0, (2.8, 10.0)), judge(25.0, (2.8, 10.0)), judge(3.0, 2.0, (0.9, 1.2))])
    assert point.word == "partly" and point.why == "1 to 2.67x; 1 of 3 unresolved"


def test_nothing_measured_is_not_judged():
    assert judge(None, 1.27).word == "n/a" and judge(float("nan"), 1.27, kind=GAIN).word == "n/a"


@pytest.mark.parametrize("ours,word", [(1.15, "yes"), (1.20, "yes"), (1.10, "yes"), (1.21, "larger"),
                                       (1.05, "smaller"), (1.0, "smaller"), (0.8, "smaller")])
def test_a_bound_fails_past_it_and_holds_with_room_far_under_it(ours, word):
    # The paper's "within 20%": past 1.2x breaks it; under half its cost, none included, keeps it
    # with room: not the paper's size, and never "no" (the bound holds).
    assert judge(ours, 1.2, kind=BOUND).word == word
    assert (judge(ours, 1.2, kind=BOUND).why == "no cost at all") == (ours <= 1)


@given(st.floats(0.1, 3.0), st.floats(0.1, 3.0))
def test_a_bound_s_verdict_is_monotone_in_ours(a, b):
    order = ["smaller", "yes", "larger"]
    low, high = sorted((a, b))
    assert order.index(judge(low, 1.2, kind=BOUND).word) <= order.index(
        judge(high, 1.2, kind=BOUND).word)


def test_a_bound_s_spread_is_judged_at_its_ends():
    # Reaching 1x is no noise question for a bound: both ends far under it keep it with room.
    assert judge(1.02, 1.2, (0.97, 1.05), kind=BOUND).word == "smaller"
    assert judge(1.15, 1.2, (1.08, 1.25), kind=BOUND).word == "unclear"
