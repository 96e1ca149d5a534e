"""Block tables as rows of one persistent array (vLLM v1's BlockTable): only new blocks are
written; a row is reused once ``BlockManager.free`` replaces ``seq.block_table``."""
from __future__ import annotations

import numpy as np

from sarathi_lab.engine.sequence import Sequence


class BlockTables:
    def __init__(self, rows: int = 64, width: int = 64):
        # Past a request's blocks a row holds zeros, the padding the metadata promises.
        self.table = np.zeros((rows, width), dtype=np.int32)
        # id(seq) -> [row, the list read from, blocks held, seq (held: its id is not reused)].
        self._rows: dict[int, list] = {}
        self._free = list(range(rows - 1, -1, -1))

    def rows(self, seqs: list[Sequence]) -> tuple[list[int], list[int]]:
        """Blocks held: the whole table (orca and static reserve beyond the context)."""
        rows, held = [], []
        entries = self._rows
        for seq in seqs:
            table = seq.block_table
            entry = entries.get(id(seq))
            if entry is None or entry[1] is not table:
                entry = self._assign(seq, entry)
            n = len(table)
            if n != entry[2]:
                self._write(entry, n)
            rows.append(entry[0])
            held.append(n)
        return rows, held

    def _assign(self, seq: Sequence, entry: list | None) -> list:
        if entry is not None:  # its blocks were given back and it holds new ones: start over
            self.table[entry[0], : entry[2]] = 0
            entry[1], entry[2] = seq.block_table, 0
            return entry
        if not self._free:
            self._reclaim()
        entry = [self._free.pop(), seq.block_table, 0, seq]
        self._rows[id(seq)] = entry
        return entry

    def _reclaim(self) -> None:
        stale = [key for key, (_, table, _, seq) in self._rows.items()
                 if seq.block_table is not table]
        for key in stale:
            row, _, n, _ = self._rows.pop(key)
            self.table[row, :n] = 0
            self._free.append(row)
        if not self._free:
            rows = len(self.table)
            self.table = np.concatenate([self.table, np.zeros_like(self.table)])
            self._free = list(range(2 * rows - 1, rows - 1, -1))

    def _write(self, entry: list, n: int) -> None:
        row, table, held, _ = entry
        if n > self.table.shape[1]:
            width = max(n, 2 * self.table.shape[1])
            self.table = np.pad(self.table, ((0, 0), (0, width - self.table.shape[1])))
        if n < held:  # not the block manager's way (it only appends), but cheap to keep right
            self.table[row, n:held] = 0
            held = 0
        self.table[row, held:n] = table[held:n]
        entry[2] = n
