"""What a running pipeline's stages spend between two forwards, read off its ``stage_timeline``: an
idle ping-pong (``link.py``) is not what a message costs a pipeline that computes while it moves.
Each term: medians by tokens."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

NEEDED = ("stage", "micro_batch", "start_s", "end_s", "tokens", "command_s", "planned_s")
BINS = 4  # token ranges (quantiles) a term's medians are taken over


@dataclass(frozen=True)
class TokenTable:
    """``seconds[i]`` at ``tokens[i]``, linear between, flat beyond."""
    tokens: tuple[float, ...]
    seconds: tuple[float, ...]

    def __call__(self, tokens: float) -> float:
        return float(np.interp(tokens, self.tokens, self.seconds))

    @classmethod
    def of(cls, tokens: np.ndarray, seconds: np.ndarray, bins: int = BINS) -> TokenTable:
        """Fewer bins where tokens repeat."""
        keep = np.isfinite(seconds)
        tokens, seconds = np.asarray(tokens, float)[keep], np.asarray(seconds, float)[keep]
        if not len(tokens):
            raise ValueError("no micro-batch measures this term")
        edges = np.unique(np.quantile(tokens, np.linspace(0, 1, bins + 1)))
        which = np.clip(np.searchsorted(edges, tokens, side="right") - 1, 0, max(len(edges) - 2, 0))
        xs, ys = (np.array([float(np.median(v[which == b])) for b in np.unique(which)])
                  for v in (tokens, seconds))
        order = np.argsort(xs)
        return cls(tuple(xs[order]), tuple(ys[order]))


@dataclass(frozen=True)
class Handoff:
    """``after`` None where no micro-batch's next command waited at its end (priced 0)."""
    after: TokenTable | None
    host: TokenTable
    receive: TokenTable
    first_host: TokenTable
    micro_batches: int
    source: str = "a running pipeline"

    @classmethod
    def from_timeline(cls, timeline: pd.DataFrame, source: str = "a running pipeline") -> Handoff:
        """One row per stage and micro-batch (a stage's first rank's), two or more of each."""
        missing = [c for c in NEEDED if c not in timeline.columns]
        if missing:
            raise ValueError(f"the stage timeline lacks {missing}: only a pipeline that records "
                             "its host work measures the handoff")

        def grid(column: str) -> np.ndarray:
            return timeline.pivot(index="stage", columns="micro_batch",
                                  values=column).to_numpy(float)

        start, end, command, planned, tokens = (grid(c) for c in ("start_s", "end_s", "command_s",
                                                                   "planned_s", "tokens"))
        if start.shape[0] < 2 or start.shape[1] < 2:
            raise ValueError(f"a handoff needs two or more stages and micro-batches: "
                             f"{start.shape[0]} stages, {start.shape[1]} micro-batches")
        later = slice(1, None)
        # A header there before stage s's previous forward ended: from that end on, the stage's own.
        after = command[later, 1:] - end[later, :-1]
        after = np.where(command[:-1, 1:] <= end[later, :-1], after, np.nan)
        receive = start[later] - np.maximum(planned[later], end[:-1])
        waited = np.isfinite(after).any()
        after = TokenTable.of(tokens[later, :-1].ravel(), after.ravel()) if waited else None
        return cls(after=after,
                   host=TokenTable.of(tokens[later].ravel(), (planned - command)[later].ravel()),
                   receive=TokenTable.of(tokens[later].ravel(), receive.ravel()),
                   first_host=TokenTable.of(tokens[0], planned[0] - command[0]),
                   micro_batches=start.shape[1], source=source)

    def after_s(self, tokens: float) -> float:
        return self.after(tokens) if self.after is not None else 0.0

    def describe(self) -> str:
        def span(t: TokenTable | None) -> str:
            if not t:
                return "not measured (0)"
            return f"{min(t.seconds) * 1e3:.2f}-{max(t.seconds) * 1e3:.2f} ms"

        return (f"handoff measured on {self.source} ({self.micro_batches} micro-batches): after a "
                f"forward {span(self.after)}, on a command {span(self.host)} (stage 0 "
                f"{span(self.first_host)}), receiving activations {span(self.receive)}")
