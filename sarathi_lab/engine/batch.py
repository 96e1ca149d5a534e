"""What a scheduler decides for one iteration: which requests run and how many tokens each.

No tensors here: an executor turns this into tensors (or, simulated, into a predicted time).
Prefill chunks come first, then one token for each decode, the Sarathi layout.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from sarathi_lab.engine.sequence import Sequence


@dataclass
class ScheduledChunk:
    seq: Sequence
    num_tokens: int

    @property
    def samples(self) -> bool:
        """Whether this chunk reaches the request's last token, so that a new token is sampled."""
        return self.seq.num_computed + self.num_tokens == len(self.seq.tokens)

    @property
    def context_len(self) -> int:
        """Tokens of the request that attention reads once this chunk's keys are cached."""
        return self.seq.num_computed + self.num_tokens


@dataclass
class ScheduledBatch:
    prefills: list[ScheduledChunk] = field(default_factory=list)
    decodes: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.num_tokens for c in self.prefills)

    @property
    def num_decode_tokens(self) -> int:
        return len(self.decodes)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @functools.cached_property
    def chunks(self) -> list[ScheduledChunk]:
        """Built once, when first read: by then the scheduler has returned the batch, and a step
        reads it several times (records, update, executor)."""
        return self.prefills + [ScheduledChunk(s, 1) for s in self.decodes]

    # The two below read the requests' state before the step: an executor reads them, and the
    # scheduler's update() changes that state after it.

    @property
    def sampled(self) -> list[Sequence]:
        """Requests that get a new token from this iteration, in batch order."""
        return [c.seq for c in self.chunks if c.samples]

    @property
    def kv_tokens_read(self) -> int:
        """Cached keys/values attention reads per layer: every request reads its whole context."""
        return sum(c.context_len for c in self.chunks)

    def __contains__(self, seq: Sequence) -> bool:
        return seq in self.decodes or any(c.seq is seq for c in self.prefills)

    def __bool__(self) -> bool:
        return bool(self.prefills or self.decodes)
