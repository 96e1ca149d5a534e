"""KV-cache blocks handed out on demand. A request is admitted only while ``watermark_blocks`` stay
free after its blocks (vLLM's can_allocate), so running requests' growth, which may take the last
block, does not preempt one at the next step."""
from __future__ import annotations

from sarathi_lab.engine.sequence import Sequence


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def watermark_blocks(watermark: float, num_blocks: int) -> int:
    return int(watermark * num_blocks)


def blocks_beside_watermark(blocks: int, watermark: float) -> int:
    # total - int(watermark * total) < total * (1 - watermark) + 1: none below
    # (blocks - 1) / (1 - watermark) serves (the 1 below it is for the division's rounding).
    total = max(blocks, int((blocks - 1) / (1 - watermark)) - 1)
    while total - watermark_blocks(watermark, total) < blocks:
        total += 1
    return total


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.0):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.watermark_blocks = watermark_blocks(watermark, num_blocks)
        # Freed blocks reused first (cache-warm), then fresh ones from _fresh up; nothing per block.
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
        return self.num_blocks - self.watermark_blocks

    @property
    def admissible_tokens(self) -> int:
        return self.admissible_blocks * self.block_size

    def can_fit(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= self.num_free

    def can_admit(self, seq: Sequence, num_tokens: int, freed: int = 0) -> bool:
        """``freed``: blocks about to be freed (a guess ahead counts them)."""
        return self.blocks_needed(seq, num_tokens) + self.watermark_blocks <= self.num_free + freed

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
        if self._freed:
            seq.block_table.append(self._freed.pop())
        else:
            seq.block_table.append(self._fresh)
            self._fresh += 1

    def free(self, seq: Sequence) -> None:
        self._freed.extend(reversed(seq.block_table))
        seq.block_table = []
