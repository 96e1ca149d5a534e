"""A scheduled batch into tensors, through the model, to the sampled rows' logits."""
from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from sarathi_lab.attention import AttentionMetadata
from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.next_batch import NextBatch
from sarathi_lab.model.block_tables import BlockTables
from sarathi_lab.model.decoder import CausalLM
from sarathi_lab.model.nano_batch import NO_OVERLAP, NanoBatch, OverlapRule, nano_batches


@dataclass
class PreparedBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor
    # None: it runs whole.
    nano: tuple[NanoBatch, NanoBatch] | None = None


class HostStaging:
    """Pinned, so the copy runs while the host launches the forward (as vLLM's runner)."""

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None
        self._copied: torch.cuda.Event | None = None

    def buffer(self, nbytes: int) -> torch.Tensor:
        if self._copied is not None:
            self._copied.synchronize()
            self._copied = None
        buf = self._buffer
        if buf is None or buf.numel() < nbytes:
            size = max(nbytes, 2 * (0 if buf is None else buf.numel()), 1 << 16)
            # Pinned only where CUDA is: pinning needs its driver.
            buf = self._buffer = torch.empty(size, dtype=torch.uint8,
                                             pin_memory=torch.cuda.is_available())
        return buf[:nbytes]

    def copied(self) -> None:
        if torch.cuda.is_available():
            self._copied = torch.cuda.Event()
            self._copied.record()


class ModelRunner:
    def __init__(self, model: CausalLM, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 block_size: int, device: torch.device, overlap: OverlapRule = NO_OVERLAP):
        self.model = model
        self.overlap = overlap
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.tables = BlockTables()
        self.staging = HostStaging() if device.type == "cuda" else None
        # CPU decode-only batches from Python arrays; bench.host_path turns it off to time a GPU's.
        self.decode_lists = True

    def prepare(self, batch: ScheduledBatch) -> PreparedBatch:
        prepared = batch_tensors(batch, self.block_size, self.device, self.tables, self.staging,
                                 self.decode_lists)
        # Once here rather than in every layer.
        self.model.backend.plan(prepared.meta, self.kv_caches[0][0])
        meta = prepared.meta
        at = self.overlap.cut(prepared.input_ids.shape[0], meta.num_prefill_tokens,
                              meta.num_decodes)
        if at is not None:
            prepared.nano = nano_batches(prepared.positions, meta, at)
            for part in prepared.nano:
                self.model.backend.plan(part.meta, self.kv_caches[0][0])
        return prepared

    def warm(self, likely: NextBatch) -> None:
        """``likely``'s attention planned ahead, unless run as nano-batches (planned per part)."""
        lens, prefills = likely.query_lens, likely.num_prefills
        if self.overlap.cut(sum(lens), sum(lens[:prefills]), len(lens) - prefills) is None:
            self.model.backend.warm(likely.query_lens, likely.seq_lens, likely.num_prefills,
                                    self.model.config.num_attention_heads, self.kv_caches[0][0])

    @torch.inference_mode()
    def forward(self, prepared: PreparedBatch, argmax: bool = False) -> torch.Tensor | list[int]:
        # Passed only where cut: a stand-in model (bench.host_path's) takes no such argument.
        split = {} if prepared.nano is None else {"nano": prepared.nano}
        return self.model(prepared.input_ids, prepared.positions, self.kv_caches, prepared.meta,
                          prepared.logits_indices, argmax=argmax, **split)

    def fuses_argmax(self, prepared: PreparedBatch) -> bool:
        return 0 < len(prepared.logits_indices) <= self.model.argmax_rows


def batch_tensors(batch: ScheduledBatch, block_size: int, device: torch.device,
                  tables: BlockTables | None = None, staging: HostStaging | None = None,
                  decode_lists: bool = True) -> PreparedBatch:
    bs = block_size
    prefills, decodes = batch.prefills, batch.decodes
    if not prefills and decode_lists and device.type == "cpu":
        return _cpu_decode_tensors(decodes, bs, tables)
    seqs = [c.seq for c in prefills] + decodes
    tables = tables if tables is not None else BlockTables()
    rows, held = tables.rows(seqs)
    starts = [s.num_computed for s in seqs]
    query_lens = [c.num_tokens for c in prefills] + [1] * len(decodes)
    ids = array("q")
    for c, start in zip(prefills, starts):
        ids.extend(c.seq.tokens[start : start + c.num_tokens])
    ids.extend([s.tokens[s.num_computed] for s in decodes])

    start = np.array(starts, dtype=np.int64)
    if prefills:
        lens = np.array(query_lens, dtype=np.int64)
        query_start_loc = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(lens, out=query_start_loc[1:])
        token_req = np.repeat(np.arange(len(seqs)), lens)
        positions = np.arange(len(ids)) + (start - query_start_loc[:-1])[token_req]
        seq_lens = start + lens
    else:  # one token per request
        query_start_loc = np.arange(len(seqs) + 1)
        token_req, positions, seq_lens = query_start_loc[:-1], start, start + 1
    # Blocks up to each context, zero after: tables as wide as the longest context.
    cached = (seq_lens + (bs - 1)) // bs
    block_tables = tables.table[rows, : int(cached.max())]
    slots = block_tables[token_req, positions // bs] * np.int64(bs) + positions % bs
    spare = np.array(held) - cached
    if spare.any():
        # The rows past its table are zeros: its slots would land in block 0.
        if spare.min() < 0:
            i = int(spare.argmin())
            raise _too_few_blocks(seqs[i], held[i], int(cached[i]))
        reserved = np.flatnonzero(spare)
        past = np.arange(block_tables.shape[1]) >= cached[reserved, None]
        block_tables[reserved] = np.where(past, 0, block_tables[reserved])
    ends = query_start_loc[1:] - 1
    logits_indices = (ends if all(c.samples for c in prefills)
                      else ends[[c.samples for c in prefills] + [True] * len(decodes)])

    ((input_ids, positions_t, slot_mapping, logits_t),
     (query_start_loc_t, seq_lens_t, block_tables_t)) = _on_device(
        [np.frombuffer(ids, dtype=np.int64), positions, slots, logits_indices],
        [query_start_loc, seq_lens, block_tables.reshape(-1)], device, staging)
    meta = AttentionMetadata(
        num_prefills=len(prefills), num_decodes=len(decodes),
        num_prefill_tokens=batch.num_prefill_tokens, query_start_loc=query_start_loc_t,
        seq_lens=seq_lens_t, block_tables=block_tables_t.view(block_tables.shape),
        slot_mapping=slot_mapping, query_lens_host=query_lens, seq_lens_host=seq_lens.tolist(),
        max_query_len=max(query_lens))
    return PreparedBatch(input_ids, positions_t, meta, logits_t)


# Up to this many entries a CPU decode copies tables from lists: gathers lose on cold caches.
LIST_TABLE_ENTRIES = 4096


def _cpu_decode_tensors(decodes: list, bs: int, tables: BlockTables | None) -> PreparedBatch:
    n = len(decodes)
    ids, positions, slots, seq_lens = array("q"), array("q"), array("q"), array("i")
    width, reserved = 0, False
    for seq in decodes:
        start, table = seq.num_computed, seq.block_table
        cached = start // bs + 1
        if len(table) != cached:
            if len(table) < cached:
                raise _too_few_blocks(seq, len(table), cached)
            reserved = True  # orca and static hold blocks past the context
        width = max(width, cached)
        ids.append(seq.tokens[start])
        positions.append(start)
        slots.append(table[start // bs] * bs + start % bs)
        seq_lens.append(start + 1)
    if n * width <= LIST_TABLE_ENTRIES or tables is None:
        flat = array("i")
        for seq, context in zip(decodes, seq_lens):
            cached = (context - 1) // bs + 1
            flat.extend(seq.block_table[:cached] if reserved else seq.block_table)
            if cached < width:
                flat.frombytes(bytes(4 * (width - cached)))
        block_tables = torch.frombuffer(flat, dtype=torch.int32).view(n, width)
    else:
        rows, _ = tables.rows(decodes)
        kept = tables.table[rows, :width]
        if reserved:
            for i, context in enumerate(seq_lens):
                kept[i, (context - 1) // bs + 1 :] = 0
        block_tables = torch.from_numpy(kept)
    frombuffer = torch.frombuffer
    meta = AttentionMetadata(
        num_prefills=0, num_decodes=n, num_prefill_tokens=0,
        query_start_loc=frombuffer(array("i", range(n + 1)), dtype=torch.int32),
        seq_lens=frombuffer(seq_lens, dtype=torch.int32), block_tables=block_tables,
        slot_mapping=frombuffer(slots, dtype=torch.int64), query_lens_host=[1] * n,
        seq_lens_host=seq_lens.tolist(), max_query_len=1)
    return PreparedBatch(frombuffer(ids, dtype=torch.int64),
                         frombuffer(positions, dtype=torch.int64), meta,
                         frombuffer(array("q", range(n)), dtype=torch.int64))


def _too_few_blocks(seq, held: int, cached: int) -> ValueError:
    """Refused where the kept table's zero padding would send the request's keys to block 0."""
    return ValueError(f"request {seq.seq_id} holds {held} KV blocks, fewer than the {cached} "
                      "its context needs: the scheduler must allocate a step's blocks before it "
                      "runs")


def _on_device(longs: list[np.ndarray], ints: list[np.ndarray], device: torch.device,
               staging: HostStaging | None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Elsewhere than the CPU, views of one asynchronous host-to-device copy."""
    if device.type == "cpu":
        return ([torch.from_numpy(p) for p in longs],
                [torch.from_numpy(p.astype(np.int32, copy=False)) for p in ints])
    host, spans = packed(longs, ints, staging.buffer if staging is not None else pageable)
    flat = host.to(device, non_blocking=staging is not None)
    if staging is not None:
        staging.copied()
    views = unpacked(flat, spans)
    return views[: len(longs)], views[len(longs):]


# Triton recompiles per pointer alignment: offsets moving with batch sizes compile mid-run.
PART_ALIGN = 16


def packed(longs: list[np.ndarray], ints: list[np.ndarray], alloc: Callable[[int], torch.Tensor]
           ) -> tuple[torch.Tensor, list[tuple[int, int, torch.dtype]]]:
    parts = [(p, torch.int64) for p in longs] + [(p, torch.int32) for p in ints]
    spans, end = pack_layout([len(p) for p in longs], [len(p) for p in ints])
    host = alloc(end)
    raw = host.numpy()
    for (offset, n, dtype), (part, _) in zip(spans, parts):
        np_dtype = np.int64 if dtype == torch.int64 else np.int32
        np.copyto(raw[offset : offset + n * dtype.itemsize].view(np_dtype), part, casting="unsafe")
    return host, spans


def pack_layout(longs: list[int], ints: list[int]
                ) -> tuple[list[tuple[int, int, torch.dtype]], int]:
    spans, end = [], 0
    for n, dtype in [(n, torch.int64) for n in longs] + [(n, torch.int32) for n in ints]:
        spans.append((end, n, dtype))
        end += -(-n * dtype.itemsize // PART_ALIGN) * PART_ALIGN
    return spans, end


def unpacked(flat: torch.Tensor, spans: list[tuple[int, int, torch.dtype]]) -> list[torch.Tensor]:
    return [flat[offset : offset + n * dtype.itemsize].view(dtype) for offset, n, dtype in spans]


def pageable(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8)
