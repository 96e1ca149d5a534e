"""Fixed-size KV-cache blocks handed out to requests on demand, and taken back when they finish
or are preempted. A request holds the blocks of the tokens it was given blocks for, in order: its
cached tokens under the paged schedulers, max_model_len tokens from admission under orca and static."""
from __future__ import annotations

from sarathi_lab.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Popped from the end: recently freed (cache-warm) blocks are reused first.
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        total = -(-(seq.num_computed + num_new_tokens) // self.block_size)
        return max(0, total - len(seq.block_table))

    def can_fit(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= len(self._free)

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        n = self.blocks_needed(seq, num_new_tokens)
        if n > len(self._free):
            raise RuntimeError(f"request {seq.seq_id} needs {n} blocks, {len(self._free)} free")
        for _ in range(n):
            seq.block_table.append(self._free.pop())

    def free(self, seq: Sequence) -> None:
        self._free.extend(reversed(seq.block_table))
        seq.block_table = []
