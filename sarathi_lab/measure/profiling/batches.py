"""Hand-built iterations placed in a live engine's KV cache by its own block manager, so a timed
forward touches the cache as a served one would. ``layout``: allocated, served, scattered (worst) or
contiguous (best); the last three claim every free block until ``close()``."""
from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

from sarathi_lab.config import AS_WRITTEN, check_choice
from sarathi_lab.engine.batch import ScheduledBatch, ScheduledChunk
from sarathi_lab.engine.block_manager import blocks_for
from sarathi_lab.engine.sequence import Sequence

LAYOUTS = ("allocated", "served", "scattered", "contiguous")


class SyntheticBatches:
    def __init__(self, llm, *, seed: int = 0, layout: str = "allocated"):
        check_choice("layout", layout, LAYOUTS, AS_WRITTEN)
        self.blocks = llm.block_manager
        self.block_size = self.blocks.block_size
        self.vocab = llm.model_config.vocab_size
        self.max_len = llm.max_model_len
        self.layout = layout
        self.rng = random.Random(seed)
        self.next_id = 0
        self._pool = None
        if layout != "allocated":
            self._pool = Sequence(-1, [], max_new_tokens=0)
            self.blocks.allocate(self._pool, self.blocks.num_free * self.block_size)
            self._lay_out()

    def _lay_out(self) -> None:
        blocks = sorted(self._pool.block_table)
        half = len(blocks) // 2
        self._runs, self._scattered = blocks[:half], blocks[half:]
        self.rng.shuffle(self._scattered)

    def _place(self, seq: Sequence, total: int, prompt: int) -> None:
        if self._pool is None:
            self.blocks.allocate(seq, total)
            return
        need = blocks_for(total, self.block_size)
        run = {"served": prompt // self.block_size, "scattered": 0, "contiguous": need}[self.layout]
        if run > len(self._runs) or need - run > len(self._scattered):
            raise RuntimeError(f"the KV cache ({len(self._pool.block_table)} blocks) is too small "
                               f"for this batch laid out {self.layout}")
        seq.block_table = self._runs[:run] + [self._scattered.pop() for _ in range(need - run)]
        del self._runs[:run]

    def _request(self, total: int, computed: int, prompt: int) -> Sequence:
        # The scheduler refuses these: past the rotary table reads out of bounds (silent on CPU).
        if total > self.max_len:
            raise ValueError(f"a request of {total} tokens is invalid: the model allows at most "
                             f"{self.max_len} (max_model_len)")
        seq = Sequence(self.next_id, [self.rng.randrange(self.vocab) for _ in range(total)],
                       max_new_tokens=1)
        self.next_id += 1
        self._place(seq, total, prompt)
        seq.num_computed = computed
        return seq

    def make(self, prefills: list[tuple[int, int]] = (), decodes: int = 0,
             context: int = 1) -> ScheduledBatch:
        """``prefills``: (chunk, tokens cached before it) per request, each chunk ending its prompt;
        ``decodes`` at ``context`` each."""
        if self._pool is not None:
            self._lay_out()
        return ScheduledBatch([ScheduledChunk(self._request(before + c, before, before + c), c)
                               for c, before in prefills],
                              [self._request(context, context - 1, context * 3 // 4)
                               for _ in range(decodes)])

    def free(self, batch: ScheduledBatch) -> None:
        """Laid-out batches keep theirs in the claimed pool."""
        for chunk in batch.chunks:
            if self._pool is None:
                self.blocks.free(chunk.seq)
            chunk.seq.block_table = []

    @contextlib.contextmanager
    def made(self, prefills: list[tuple[int, int]] = (), decodes: int = 0,
             context: int = 1) -> Iterator[ScheduledBatch]:
        """Freed from the cache as the block ends, however it ends."""
        batch = self.make(prefills, decodes, context)
        try:
            yield batch
        finally:
            self.free(batch)

    def close(self) -> None:
        if self._pool is not None:
            self.blocks.free(self._pool)
            self._pool = None
