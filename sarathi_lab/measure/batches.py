"""Hand-built iterations on a live engine: requests placed in its KV cache through its own block
manager, so that a timed forward reads and writes the cache as a served iteration would."""
from __future__ import annotations

import random

from sarathi_lab.engine.batch import ScheduledBatch, ScheduledChunk
from sarathi_lab.engine.sequence import Sequence


class SyntheticBatches:
    def __init__(self, llm, seed: int = 0):
        self.blocks = llm.block_manager
        self.vocab = llm.model_config.vocab_size
        self.rng = random.Random(seed)
        self.next_id = 0

    def _request(self, total: int, computed: int) -> Sequence:
        seq = Sequence(self.next_id, [self.rng.randrange(self.vocab) for _ in range(total)], max_new_tokens=1)
        self.next_id += 1
        self.blocks.allocate(seq, total)
        seq.num_computed = computed
        return seq

    def make(self, prefills: list[tuple[int, int]] = (), decodes: int = 0, context: int = 1) -> ScheduledBatch:
        """``prefills``: (chunk tokens, tokens cached before the chunk) per request, each chunk ending
        its prompt; ``decodes`` requests with ``context`` tokens each, the newest one uncached."""
        batch = ScheduledBatch()
        for chunk, before in prefills:
            batch.prefills.append(ScheduledChunk(self._request(before + chunk, before), chunk))
        batch.decodes = [self._request(context, context - 1) for _ in range(decodes)]
        return batch

    def free(self, batch: ScheduledBatch) -> None:
        for chunk in batch.chunks:
            self.blocks.free(chunk.seq)
