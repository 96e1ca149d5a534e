"""The runner's batch tensors, built over whole batches with block tables kept between iterations,
against a per-token reference: every token's id, position and cache slot, every request's row of
the block tables, over iterations in which tables grow, are given back and taken again."""
from __future__ import annotations

import itertools
import random
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sarathi_lab.engine.batch import ScheduledBatch, ScheduledChunk
from sarathi_lab.engine.sequence import Sequence
from sarathi_lab.model import runner
from sarathi_lab.model.block_tables import BlockTables
from sarathi_lab.model.runner import HostStaging, batch_tensors

CPU = torch.device("cpu")


def reference(batch: ScheduledBatch, bs: int) -> dict:
    """Token by token, request by request, from the definitions in attention/metadata.py."""
    ids, positions, slots, logits, starts, seq_lens, tables = [], [], [], [], [0], [], []
    for chunk in batch.chunks:
        seq, n = chunk.seq, chunk.num_tokens
        for p in range(seq.num_computed, seq.num_computed + n):
            ids.append(seq.tokens[p])
            positions.append(p)
            slots.append(seq.block_table[p // bs] * bs + p % bs)
        starts.append(starts[-1] + n)
        seq_lens.append(seq.num_computed + n)
        tables.append(seq.block_table[: -(-seq_lens[-1] // bs)])  # reserved blocks past the context left out
        if chunk.samples:
            logits.append(len(ids) - 1)
    width = max(map(len, tables))
    return {"input_ids": ids, "positions": positions, "slot_mapping": slots, "logits_indices": logits,
            "query_start_loc": starts, "seq_lens": seq_lens,
            "block_tables": [t + [0] * (width - len(t)) for t in tables]}


def built(prepared) -> dict:
    meta = prepared.meta
    out = {"input_ids": prepared.input_ids, "positions": prepared.positions, "slot_mapping": meta.slot_mapping,
           "logits_indices": prepared.logits_indices, "query_start_loc": meta.query_start_loc,
           "seq_lens": meta.seq_lens, "block_tables": meta.block_tables}
    dtypes = {name: t.dtype for name, t in out.items()}
    assert dtypes == {"input_ids": torch.int64, "positions": torch.int64, "slot_mapping": torch.int64,
                      "logits_indices": torch.int64, "query_start_loc": torch.int32, "seq_lens": torch.int32,
                      "block_tables": torch.int32}
    assert meta.seq_lens_host == meta.seq_lens.tolist()
    assert meta.query_lens_host == meta.query_start_loc.diff().tolist()
    assert meta.max_query_len == max(meta.query_lens_host)
    return {name: t.tolist() for name, t in out.items()}


class Pool:
    """Block ids handed out in a random order, as a block manager's free list is after a while."""

    def __init__(self, rng: random.Random, n: int = 4096):
        self.free = list(range(n))
        rng.shuffle(self.free)

    def take(self, seq: Sequence, n: int) -> None:
        seq.block_table.extend(self.free.pop() for _ in range(n))

    def give_back(self, seq: Sequence) -> None:
        self.free.extend(seq.block_table)
        seq.block_table = []  # a new list, as BlockManager.free leaves it


def _step(rng: random.Random, pool: Pool, seqs: list[Sequence], bs: int, reserve: bool) -> ScheduledBatch:
    """One iteration's batch over ``seqs``, blocks taken for its tokens (all of them, ahead, with
    ``reserve``, as orca and static do); some requests are preempted first."""
    batch = ScheduledBatch()
    for seq in seqs:
        if seq.num_computed and rng.random() < 0.1:  # preempted: blocks back, recomputed from scratch
            pool.give_back(seq)
            seq.num_computed = 0
        left = len(seq.tokens) - seq.num_computed
        n = 1 if left == 1 else rng.randint(1, left)
        need = len(seq.tokens) + 8 if reserve else seq.num_computed + n
        pool.take(seq, max(0, -(-need // bs) - len(seq.block_table)))
        if seq.num_computed + 1 == len(seq.tokens):
            batch.decodes.append(seq)
        else:
            batch.prefills.append(ScheduledChunk(seq, n))
    return batch


def _after(batch: ScheduledBatch, rng: random.Random) -> None:
    sampled = batch.sampled  # read before the requests move on
    for chunk in batch.chunks:
        chunk.seq.num_computed += chunk.num_tokens
    for seq in sampled:
        seq.tokens.append(rng.randrange(32000))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), requests=st.integers(1, 12), bs=st.sampled_from([1, 2, 4, 16]),
       steps=st.integers(1, 8), reserve=st.booleans())
def test_batch_tensors_match_the_per_token_reference_across_iterations(seed, requests, bs, steps, reserve):
    rng = random.Random(seed)
    pool = Pool(rng)
    seqs = [Sequence(i, [rng.randrange(32000) for _ in range(rng.randint(1, 40))], 8) for i in range(requests)]
    # Few rows and columns to start with, so that both grow and rows are reclaimed.
    tables = BlockTables(rows=2, width=2)
    for _ in range(steps):
        live = [s for s in seqs if s.num_generated < s.max_new_tokens]
        if not live:
            break
        running = rng.sample(live, rng.randint(1, len(live)))
        batch = _step(rng, pool, running, bs, reserve)
        batch.prefills.sort(key=lambda c: c.seq.seq_id)  # any order the scheduler picks
        expected = reference(batch, bs)
        assert built(batch_tensors(batch, bs, CPU, tables)) == expected
        # A fresh set of tables (what other callers get) builds the same.
        assert built(batch_tensors(batch, bs, CPU)) == expected
        _after(batch, rng)
        for seq in seqs:
            if seq.num_generated >= seq.max_new_tokens and seq.block_table:
                pool.give_back(seq)  # finished


@pytest.mark.parametrize(("decode_lists", "list_entries"), [(False, 0), (True, 0), (True, runner.LIST_TABLE_ENTRIES)],
                         ids=["numpy", "kept_rows", "lists"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), requests=st.integers(1, 20), bs=st.sampled_from([1, 2, 4, 16]),
       steps=st.integers(1, 12), reserve=st.booleans())
def test_decode_only_batches_match_the_per_token_reference(decode_lists, list_entries, seed, requests, bs, steps,
                                                           reserve):
    """Decode-only batches, which the CPU builds on a path of their own (its block tables from the
    kept rows or from the requests' lists), and the numpy path a GPU takes: contexts of every length,
    tables that grow a block at a time, reservations past the context, requests finishing and others
    taking their rows."""
    rng = random.Random(seed)
    pool = Pool(rng)
    seqs = [Sequence(i, [rng.randrange(32000) for _ in range(rng.randint(1, 60))], rng.randint(1, 12))
            for i in range(requests)]
    for seq in seqs:  # prompts computed but for their last token: every request decodes from here
        seq.num_computed = len(seq.tokens) - 1
    tables = BlockTables(rows=2, width=2)
    for _ in range(steps):
        live = [s for s in seqs if s.num_generated < s.max_new_tokens]
        if not live:
            break
        batch = ScheduledBatch()
        for seq in rng.sample(live, rng.randint(1, len(live))):
            need = len(seq.tokens) + 8 if reserve else len(seq.tokens)
            pool.take(seq, max(0, -(-need // bs) - len(seq.block_table)))
            batch.decodes.append(seq)
        expected = reference(batch, bs)
        with mock.patch.object(runner, "LIST_TABLE_ENTRIES", list_entries):
            assert built(batch_tensors(batch, bs, CPU, tables, decode_lists=decode_lists)) == expected
        assert built(batch_tensors(batch, bs, CPU, decode_lists=decode_lists)) == expected
        _after(batch, rng)
        for seq in seqs:
            if seq.num_generated >= seq.max_new_tokens and seq.block_table:
                pool.give_back(seq)


@pytest.mark.parametrize("decode_lists", [True, False])
def test_a_decode_short_of_its_blocks_is_refused_in_one_line(decode_lists):
    seq = Sequence(0, [1] * 9, 1, block_table=[3, 4])
    seq.num_computed = 8  # its ninth token needs a third block of 4
    with pytest.raises(ValueError, match="request 0 holds 2 KV blocks, fewer than the 3 its context needs"):
        batch_tensors(ScheduledBatch(decodes=[seq]), 4, CPU, decode_lists=decode_lists)


def test_a_request_row_is_zeroed_before_another_request_takes_it():
    tables = BlockTables(rows=1, width=4)
    a = Sequence(0, [1] * 9, 1, block_table=[5, 6, 7])
    tables.rows([a])
    a.block_table = []  # finished: its blocks given back
    b = Sequence(1, [1] * 2, 1, block_table=[9])
    rows, held = tables.rows([b])
    assert rows == [0] and held == [1] and tables.table[0].tolist() == [9, 0, 0, 0]


def test_rows_double_when_every_request_still_holds_its_blocks():
    tables = BlockTables(rows=2, width=2)
    seqs = [Sequence(i, [1], 1, block_table=[i, i + 10, i + 20]) for i in range(5)]
    rows, held = tables.rows(seqs)
    assert sorted(rows) == list(range(5)) and held == [3] * 5
    assert tables.table[rows, :3].tolist() == [s.block_table for s in seqs]


def test_staged_copies_build_the_same_tensors():
    # The pinned staging path (CUDA) gathers every input into one buffer, int64s then int32s, each
    # part on a 16-byte boundary; on this machine the buffer is pageable and the copy goes to the
    # meta device, but the layout is the same.
    seq = Sequence(0, list(range(10, 30)), 4, block_table=[3, 1, 2, 0, 4])
    dec = Sequence(1, [7, 8, 9], 4, num_computed=2, block_table=[6])
    batch = ScheduledBatch(prefills=[ScheduledChunk(seq, 12)], decodes=[dec])
    staging, expected = HostStaging(), reference(batch, 4)
    staged = batch_tensors(batch, 4, torch.device("meta"), staging=staging)
    assert staged.input_ids.device.type == "meta" and staged.meta.block_tables.shape == (2, 3)
    parts = [(expected[k], torch.int64) for k in ("input_ids", "positions", "slot_mapping", "logits_indices")]
    parts += [(expected["query_start_loc"], torch.int32), (expected["seq_lens"], torch.int32),
              (list(itertools.chain(*expected["block_tables"])), torch.int32)]
    raw, offset = staging.buffer(1024), 0
    for values, dtype in parts:
        size = len(values) * dtype.itemsize
        assert raw[offset : offset + size].view(dtype).tolist() == values
        offset = -(-(offset + size) // 16) * 16


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=5), st.lists(st.integers(0, 40), min_size=1, max_size=4))
def test_packed_parts_come_back_whole_each_on_a_16_byte_boundary(long_lens, int_lens):
    # Triton compiles a kernel again for each new alignment of its pointers: no part may sit at an
    # offset that moves with the lengths before it.
    longs = [torch.arange(n, dtype=torch.int64).numpy() * 3 for n in long_lens]
    ints = [torch.arange(n, dtype=torch.int64).numpy() - 7 for n in int_lens]
    host, spans = runner.packed(longs, ints, lambda n: torch.empty(n, dtype=torch.uint8))
    views = runner.unpacked(host, spans)
    assert [v.tolist() for v in views] == [p.tolist() for p in longs + ints]
    assert [v.dtype for v in views] == [torch.int64] * len(longs) + [torch.int32] * len(ints)
    assert all(v.data_ptr() % runner.PART_ALIGN == 0 for v in views) and runner.PART_ALIGN == 16


def test_a_request_without_the_blocks_of_its_step_is_refused():
    # Its table's missing rows read as block 0: its keys would overwrite another request's.
    seq = Sequence(3, [1] * 9, 1, block_table=[5, 6])
    batch = ScheduledBatch(prefills=[ScheduledChunk(seq, 9)])
    with pytest.raises(ValueError, match="request 3 holds 2 KV blocks, fewer than the 3 its context needs"):
        batch_tensors(batch, 4, CPU)
