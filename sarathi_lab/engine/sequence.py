"""A request's state."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sarathi_lab.config import MAX_SEED, as_python_number


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class SamplingParams:
    """A token depends on seed, request index and logits, never the batch; None seeds 0."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    # Benchmarks need exact decode lengths, so they run past the end-of-sequence token.
    ignore_eos: bool = False

    def __post_init__(self):
        for key in ("temperature", "top_p", "seed"):
            object.__setattr__(self, key, as_python_number(getattr(self, key)))
        # Written so that NaN fails too: every comparison with NaN is False.
        if not (isinstance(self.temperature, (int, float))
                and 0 <= self.temperature < float("inf")):
            raise ValueError(f"temperature={self.temperature!r} is invalid: must be a finite "
                             f"number >= 0")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p={self.top_p!r} is invalid: must be in (0, 1]")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed <= MAX_SEED):
            raise ValueError(f"seed={self.seed!r} is invalid: must be an int in [0, 2**64)")


@dataclass(eq=False, slots=True)
class Sequence:
    """Prefill and decode are one mechanism; preemption recomputes all as one prefill."""

    seq_id: int
    prompt: list[int]
    max_new_tokens: int
    arrival: float = 0.0
    eos_token_id: int | None = None
    tokens: list[int] = field(default_factory=list)
    num_computed: int = 0
    status: Status = Status.WAITING
    block_table: list[int] = field(default_factory=list)
    # Its index in its generate call, keying its draws: the call repeats its tokens on any engine.
    sample_key: int = 0
    prompt_len: int = field(init=False)

    def __post_init__(self):
        self.tokens = list(self.prompt)
        self.prompt_len = len(self.prompt)

    @property
    def priority(self) -> tuple[float, int]:
        return self.arrival, self.seq_id

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def num_uncomputed(self) -> int:
        return len(self.tokens) - self.num_computed


def split_prefilling(seqs: list[Sequence]) -> tuple[list[Sequence], list[Sequence]]:
    """One pass, no property call per request: asked of every request every iteration."""
    decoding, prefilling = [], []
    for seq in seqs:
        n = len(seq.tokens)
        (prefilling if n - seq.num_computed > 1 or n == seq.prompt_len else decoding).append(seq)
    return decoding, prefilling


def append_tokens(seqs: tuple[Sequence, ...], tokens: list[int]) -> list[Sequence]:
    done = []
    for seq, token in zip(seqs, tokens):
        held = seq.tokens
        held.append(token)
        if len(held) - seq.prompt_len >= seq.max_new_tokens or (
                token == seq.eos_token_id and seq.eos_token_id is not None):
            done.append(seq)
    return done
