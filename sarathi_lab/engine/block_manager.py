"""Fixed-size KV-cache blocks handed out to requests on demand, taken back when they finish or are
preempted. A new request is admitted only while ``watermark_blocks`` stay free after its blocks, as
vLLM's and sarathi-serve's can_allocate decide, so that the running requests' growth does not
preempt one of them at the next step; that growth itself may take the last block."""
from __future__ import annotations

from sarathi_lab.engine.sequence import Sequence


def blocks_for(tokens: int, block_size: int) -> int:
    """The blocks ``tokens`` keys and values take: the last one partly filled."""
    return -(-tokens // block_size)


def watermark_blocks(watermark: float, num_blocks: int) -> int:
    """The blocks admission leaves free: int(watermark * num_blocks), as vLLM counts them."""
    return int(watermark * num_blocks)


def blocks_beside_watermark(blocks: int, watermark: float) -> int:
    """The fewest blocks of a cache that admits requests taking ``blocks`` with its watermark left free."""
    # total - int(watermark * total) < total * (1 - watermark) + 1: none below (blocks - 1) / (1 - watermark)
    # serves (the 1 below it is for the division's rounding).
    total = max(blocks, int((blocks - 1) / (1 - watermark)) - 1)
    while total - watermark_blocks(watermark, total) < blocks:
        total += 1
    return total


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.0):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.watermark_blocks = watermark_blocks(watermark, num_blocks)
        # Given-back blocks, popped from the end: recently freed (cache-warm) blocks are reused first;
        # then those never handed out, from _fresh up, in order. Nothing is built per block, so a
        # manager of millions of blocks (a simulated GPU's cache) costs nothing to make.
        self._freed: list[int] = []
        self._fresh = 0

    @property
    def num_free(self) -> int:
        return len(self._freed) + self.num_blocks - self._fresh

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        total = blocks_for(seq.num_computed + num_new_tokens, self.block_size)
        return max(0, total - len(seq.block_table))

    @property
    def admissible_blocks(self) -> int:
        """The most blocks one request can be admitted with, into an empty cache."""
        return self.num_blocks - self.watermark_blocks

    @property
    def admissible_tokens(self) -> int:
        """The most tokens one request can be admitted with, into an empty cache."""
        return self.admissible_blocks * self.block_size

    def can_fit(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= self.num_free

    def can_admit(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) + self.watermark_blocks <= self.num_free

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        n = self.blocks_needed(seq, num_new_tokens)
        if n > self.num_free:
            raise RuntimeError(f"request {seq.seq_id} needs {n} blocks, {self.num_free} free")
        reused = min(n, len(self._freed))
        if reused:
            seq.block_table.extend(reversed(self._freed[-reused:]))
            del self._freed[-reused:]
        fresh = n - reused
        seq.block_table.extend(range(self._fresh, self._fresh + fresh))
        self._fresh += fresh

    def append_block(self, seq: Sequence) -> None:
        """One more block for ``seq`` (a decode starting one), where one is free: allocate(seq, 1)'s
        block, without its counting."""
        if self._freed:
            seq.block_table.append(self._freed.pop())
        else:
            seq.block_table.append(self._fresh)
            self._fresh += 1

    def free(self, seq: Sequence) -> None:
        self._freed.extend(reversed(seq.block_table))
        seq.block_table = []
