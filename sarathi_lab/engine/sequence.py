"""A request's state as the engine moves it through waiting, running and finished."""
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
    """Greedy when ``temperature`` is 0; otherwise temperature and nucleus (top-p) sampling, seeded:
    a request's token at each position is a function of the seed, the request's index in its call
    and its logits, whatever the scheduler or the batch. ``seed`` None is 0, so that runs repeat."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    # Benchmarks need exact decode lengths, so they run past the end-of-sequence token.
    ignore_eos: bool = False

    def __post_init__(self):
        for key in ("temperature", "top_p", "seed"):  # numpy's numbers, as the engine's settings take them
            object.__setattr__(self, key, as_python_number(getattr(self, key)))
        # Written so that NaN fails too: every comparison with NaN is False.
        if not (isinstance(self.temperature, (int, float)) and 0 <= self.temperature < float("inf")):
            raise ValueError(f"temperature={self.temperature!r} is invalid: must be a finite number >= 0")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p={self.top_p!r} is invalid: must be in (0, 1]")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed <= MAX_SEED):
            raise ValueError(f"seed={self.seed!r} is invalid: must be an int in [0, 2**64)")


@dataclass(eq=False, slots=True)
class Sequence:
    """Tokens are prompt + generated; the first ``num_computed`` of them have keys/values in the cache.
    Prefill and decode are one mechanism: a step computes some uncomputed tokens, and one that reaches
    the last samples a new token (a decode: exactly one uncomputed). Preemption sets ``num_computed``
    back to 0: prompt and output so far are recomputed as one longer prefill."""

    seq_id: int
    prompt: list[int]
    max_new_tokens: int
    arrival: float = 0.0
    eos_token_id: int | None = None
    tokens: list[int] = field(default_factory=list)
    num_computed: int = 0
    status: Status = Status.WAITING
    block_table: list[int] = field(default_factory=list)
    # Keys its sampled tokens' random draws (model/sampler.py) beside the call's seed: its index in the
    # generate call that submitted it, so that the same call repeats its tokens on any engine.
    sample_key: int = 0
    # The prompt never changes: its length is read as a plain attribute every iteration.
    prompt_len: int = field(init=False)

    def __post_init__(self):
        self.tokens = list(self.prompt)
        self.prompt_len = len(self.prompt)

    @property
    def priority(self) -> tuple[float, int]:
        """First come, first served: the earlier arrival runs first and is preempted last. Ids break
        ties only; they need not follow arrival (a trace's rows, a caller's ``arrival_times``)."""
        return self.arrival, self.seq_id

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def num_uncomputed(self) -> int:
        return len(self.tokens) - self.num_computed


def split_prefilling(seqs: list[Sequence]) -> tuple[list[Sequence], list[Sequence]]:
    """(decoding, prefilling) of ``seqs``, each in its order: a request is prefilling while more than its
    one newest token waits to be computed (prompt or recompute), or it has generated nothing yet. One
    pass, no property call per request: the schedulers ask it of every running request every iteration."""
    decoding, prefilling = [], []
    for seq in seqs:
        n = len(seq.tokens)
        (prefilling if n - seq.num_computed > 1 or n == seq.prompt_len else decoding).append(seq)
    return decoding, prefilling


def append_tokens(seqs: tuple[Sequence, ...], tokens: list[int]) -> list[Sequence]:
    """Appends each request's sampled token; returns those now done, in order: max_new_tokens
    generated, or the EOS token sampled (where the request stops at one)."""
    done = []
    for seq, token in zip(seqs, tokens):
        held = seq.tokens
        held.append(token)
        if len(held) - seq.prompt_len >= seq.max_new_tokens or (
                token == seq.eos_token_id and seq.eos_token_id is not None):
            done.append(seq)
    return done
