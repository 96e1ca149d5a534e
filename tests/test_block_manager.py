"""The block manager hands out the blocks a plain free list would, in the same order."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sarathi_lab.engine.block_manager import BlockManager
from sarathi_lab.engine.sequence import Sequence


class FreeList:
    """The reference: every block in a list, popped from the end, freed blocks pushed back."""

    def __init__(self, num_blocks: int):
        self.free = list(range(num_blocks - 1, -1, -1))

    def allocate(self, table: list[int], n: int) -> None:
        table += [self.free.pop() for _ in range(n)]

    def release(self, table: list[int]) -> None:
        self.free.extend(reversed(table))
        table.clear()


@given(num_blocks=st.integers(1, 40), ops=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 12)), max_size=60))
def test_blocks_come_in_the_order_of_a_free_list(num_blocks, ops):
    manager, reference = BlockManager(num_blocks, 1), FreeList(num_blocks)
    seqs = [Sequence(i, [0], 100) for i in range(4)]
    tables: list[list[int]] = [[] for _ in seqs]
    for who, n in ops:
        seq = seqs[who]
        if n > 8:  # a request finishes or is preempted
            manager.free(seq)
            reference.release(tables[who])
        elif n <= manager.num_free:
            seq.num_computed = len(seq.block_table)
            manager.allocate(seq, n)
            reference.allocate(tables[who], n)
        assert seq.block_table == tables[who]
        assert manager.num_free == len(reference.free)
