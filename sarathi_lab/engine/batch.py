"""What a scheduler decides for one iteration: which requests run and how many tokens each.

No tensors here: the model runner turns this into tensors. Prefill chunks come first, then one
token for each decode, the Sarathi layout.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from sarathi_lab.engine.sequence import Sequence


@dataclass
class ScheduledChunk:
    seq: Sequence
    num_tokens: int


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

    @property
    def chunks(self) -> list[ScheduledChunk]:
        return self.prefills + [ScheduledChunk(s, 1) for s in self.decodes]

    def __contains__(self, seq: Sequence) -> bool:
        return seq in self.decodes or any(c.seq is seq for c in self.prefills)

    def __bool__(self) -> bool:
        return bool(self.prefills or self.decodes)
