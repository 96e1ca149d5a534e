"""One iteration's schedule, no tensors: prefill chunks first, then a token per decode."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from sarathi_lab.engine.sequence import Sequence


@dataclass(frozen=True)
class ScheduledChunk:
    """Fixed when scheduled, as vLLM v1's SchedulerOutput: later request updates change nothing."""
    seq: Sequence
    num_tokens: int
    start: int = field(init=False)
    samples: bool = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "start", self.seq.num_computed)
        object.__setattr__(self, "samples", self.start + self.num_tokens == len(self.seq.tokens))

    @classmethod
    def fixed(cls, seq: Sequence, start: int, num_tokens: int, samples: bool) -> ScheduledChunk:
        chunk = object.__new__(cls)
        # Frozen: no setattr.
        chunk.__dict__.update(seq=seq, num_tokens=num_tokens, start=start, samples=samples)
        return chunk

    @property
    def context_len(self) -> int:
        return self.start + self.num_tokens


@dataclass
class ScheduledBatch:
    prefills: list[ScheduledChunk] = field(default_factory=list)
    decodes: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    _sampled: tuple[Sequence, ...] | None = field(default=None, init=False, repr=False,
                                                  compare=False)
    _decode_contexts: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)

    @property
    def num_prefill_tokens(self) -> int:
        # A list, not a generator, and none for a decode-only batch: read every iteration.
        return sum([c.num_tokens for c in self.prefills]) if self.prefills else 0

    @property
    def num_decode_tokens(self) -> int:
        return len(self.decodes)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    def freeze(self) -> ScheduledBatch:
        """Decodes kept as plain values (vLLM v1's flat lists): read several times an iteration."""
        if self._sampled is None:
            self._decode_contexts = tuple([s.num_computed + 1 for s in self.decodes])
            self._sampled = ((*(c.seq for c in self.prefills if c.samples), *self.decodes)
                             if self.prefills else tuple(self.decodes))
        return self

    @property
    def decode_contexts(self) -> tuple[int, ...]:
        return self.freeze()._decode_contexts

    @property
    def sampled(self) -> tuple[Sequence, ...]:
        return self.freeze()._sampled

    @functools.cached_property
    def chunks(self) -> tuple[ScheduledChunk, ...]:
        contexts = self.decode_contexts
        n = len(contexts)
        return (*self.prefills, *map(ScheduledChunk.fixed, self.decodes, [x - 1 for x in contexts],
                                     [1] * n, [True] * n))

    @property
    def kv_tokens_read(self) -> int:
        prefills = sum([c.context_len for c in self.prefills]) if self.prefills else 0
        return prefills + sum(self.decode_contexts)

    def __contains__(self, seq: Sequence) -> bool:
        return seq in self.decodes or any(c.seq is seq for c in self.prefills)

    def __bool__(self) -> bool:
        return bool(self.prefills or self.decodes)
