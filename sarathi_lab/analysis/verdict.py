"""The one rule a claim is judged by: ours against the paper both ways, direction and size.

An effect is how far a ratio lies from no effect: a gain (or cost) ``g`` has effect ``g - 1``, so
the paper's 1.27x is an effect of 0.27 and its 200x one of 199. A size that is no ratio to 1
(tokens, a P:D, a rate) is compared as it is. Ours agrees ("yes") where its effect points the
paper's way and lies within ``BAND`` times the paper's either side; past that it is "larger" or
"smaller", the other way "no". A bound the paper states ("at most 1.2x") is a cost: within it
and at least half its effect is "yes", past it "larger", and under half of it, no cost at all
included, "smaller" (the bound holds with room: a finding to explain, not agreement). A ratio
whose difference from 1 lies inside its own run-to-run spread has no direction: "unresolved", and
left out of ranges and of the claim's verdict.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

# Ours' effect within this factor of the paper's, either side: the same size.
BAND = 2.0
GAIN, SIZE, BOUND = "gain", "size", "bound"
# What each word in a claims table's ``holds`` means (docs/RESULTS.md prints them).
WORDS = {
    "yes": f"ours points the paper's way and its effect is within {BAND:g}x of the paper's, "
           "either side (the effect of a gain g is g - 1)",
    "larger": f"ours points the paper's way with more than {BAND:g}x the paper's effect; for a "
              "bound the paper states (at most a cost), past the bound",
    "smaller": f"ours points the paper's way with less than 1/{BAND:g} of the paper's effect; for "
               f"a bound, a cost under 1/{BAND:g} of it, none at all included (the bound holds "
               "with room)",
    "no": "ours points the other way or shows no effect (over several points: none agrees, and "
          "they miss the paper's size both ways)",
    "partly": "a claim over several points (lengths, batch sizes, chunks): yes at some, not all",
    "unresolved": "the ratio's difference from 1 lies inside its own run-to-run spread: no "
                  "direction, so it is left out of ranges and verdicts",
    "unclear": "the verdict changes within the spread: repeats disagree, or every point is "
               "unresolved",
    "n/a": "not judged: nothing measured the paper's setting, or the verdict would hold by "
           "construction (the row says why)",
}


@dataclass(frozen=True)
class Judged:
    """A point's verdict and ours' effect over the paper's (None where none was formed)."""
    word: str
    versus: float | None = None
    why: str = ""

    def text(self) -> str:
        """The 'ours / paper' cell of one point: 'smaller (0.48x)'."""
        said = [f"{self.versus:.3g}x"] if self.versus is not None else []
        said += [self.why] if self.why else []
        return self.word + (f" ({'; '.join(said)})" if said else "")


def _effect(value: float, kind: str) -> float:
    return value if kind == SIZE else value - 1


def versus(ours: float, paper: float | tuple[float, float], kind: str = GAIN) -> float:
    """Ours' effect over the paper's; over a range's nearer end (1 inside it)."""
    effect = _effect(ours, kind)
    low, high = sorted(_effect(p, kind) for p in (paper if isinstance(paper, tuple)
                                                  else (paper, paper)))
    if low <= effect <= high and low != high:
        return 1.0
    nearer = low if abs(effect - low) <= abs(effect - high) else high
    if nearer == 0:
        raise ValueError(f"paper={paper!r} is invalid: an effect of 0 has no size to compare")
    return effect / nearer


def word_of(ratio: float, kind: str = GAIN) -> str:
    """The verdict of ours' effect over the paper's: monotone in ``ratio``."""
    if math.isnan(ratio):
        return "no"
    if kind == BOUND:  # past the bound fails it; no cost at all keeps it with room
        return "larger" if ratio > 1 else "smaller" if ratio < 1 / BAND else "yes"
    if not ratio > 0:
        return "no"
    return "larger" if ratio > BAND else "smaller" if ratio < 1 / BAND else "yes"


def resolved(spread: tuple[float, float] | None, kind: str = GAIN) -> bool:
    """False where the spread of a ratio reaches 1 (its difference lies inside its noise)."""
    if spread is None or kind != GAIN:  # a bound's spread is judged at its ends (unclear)
        return True
    low, high = sorted(spread)
    return not low <= 1 <= high


def judge(ours: float | None, paper: float | tuple[float, float],
          spread: tuple[float, float] | None = None, kind: str = GAIN) -> Judged:
    """Ours against the paper; ``spread``: ours' run-to-run low and high, where repeated.

    ``kind``: GAIN (a ratio to 1: its effect is ``ours - 1``), BOUND (a cost ratio the paper
    bounds from above) or SIZE (compared as it is)."""
    if ours is None or (isinstance(ours, float) and math.isnan(ours)):
        return Judged("n/a", why="not measured")
    if not resolved(spread, kind):
        low, high = sorted(spread)
        return Judged("unresolved", why=f"{low:.3g}-{high:.3g}x over its repeats reaches 1x")
    ratio = versus(ours, paper, kind)
    word = word_of(ratio, kind)
    if spread is not None and word_of(versus(min(spread), paper, kind), kind) != word_of(
            versus(max(spread), paper, kind), kind):
        low, high = sorted(spread)
        return Judged("unclear", ratio, f"{low:.3g} to {high:.3g} over its repeats spans "
                                        f"{word_of(versus(low, paper, kind), kind)} and "
                                        f"{word_of(versus(high, paper, kind), kind)}")
    why = "no cost at all" if kind == BOUND and ratio <= 0 else ""
    return Judged(word, ratio, why)


def combine(words: Iterable[str]) -> str:
    """A claim's verdict over its points: n/a and unresolved points left out."""
    words = list(words)
    judged = [w for w in words if w not in ("n/a", "unresolved")]
    if not judged:
        return "unclear" if "unresolved" in words else "n/a"
    if len(set(judged)) == 1:
        return judged[0]
    # A point that is itself "partly" (a length over its batch sizes) holds yes at some of its own.
    return ("partly" if {"yes", "partly"} & set(judged) else "unclear" if "unclear" in judged
            else "no")


def over(points: Iterable[Judged]) -> Judged:
    """Several points as one (a length's batch sizes): their verdict and the range of ours over
    the paper's among those judged."""
    points = list(points)
    ratios = [p.versus for p in points if p.versus is not None]
    unresolved = sum(p.word == "unresolved" for p in points)
    said = [f"{min(ratios):.3g}x" if min(ratios) == max(ratios)
            else f"{min(ratios):.3g} to {max(ratios):.3g}x"] if ratios else []
    said += [f"{unresolved} of {len(points)} unresolved"] if unresolved else []
    return Judged(combine(p.word for p in points), why="; ".join(said))


def meets(flags: Iterable[bool | None]) -> str:
    """A target of the project's own (no paper number to compare): yes, partly or no over its
    points; None: a point not judged."""
    flags = [f for f in flags if f is not None]
    return "n/a" if not flags else "yes" if all(flags) else "partly" if any(flags) else "no"


def words_markdown() -> str:
    """WORDS as the markdown list docs/RESULTS.md prints."""
    return "\n".join(f"- **{word}**: {meaning}." for word, meaning in WORDS.items())


def versus_text(points: Iterable[tuple[str, Judged]]) -> str:
    """The 'ours / paper' cell of a claim: each labelled point's, in order."""
    return "; ".join(f"{label}: {j.text()}" if label else j.text() for label, j in points)
