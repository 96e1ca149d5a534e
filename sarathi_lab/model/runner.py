"""Turns a scheduled batch into tensors, runs the model over them, returns the sampled rows' logits."""
from __future__ import annotations

from array import array
from dataclasses import dataclass

import torch

from sarathi_lab.attention import AttentionMetadata
from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.model.decoder import CausalLM


@dataclass
class PreparedBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    # Rows whose logits are needed: the last token of every request that reaches its end this step
    # (batch.sampled, in the same order).
    logits_indices: torch.Tensor


class ModelRunner:
    def __init__(self, model: CausalLM, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], block_size: int,
                 device: torch.device):
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device

    def prepare(self, batch: ScheduledBatch) -> PreparedBatch:
        prepared = batch_tensors(batch, self.block_size, self.device)
        # The attention backend's per-iteration decisions, made once here rather than in every layer.
        self.model.backend.plan(prepared.meta, self.kv_caches[0][0])
        return prepared

    @torch.inference_mode()
    def forward(self, prepared: PreparedBatch) -> torch.Tensor:
        return self.model(prepared.input_ids, prepared.positions, self.kv_caches, prepared.meta,
                          prepared.logits_indices)

    def fuses_argmax(self, prepared: PreparedBatch) -> bool:
        """Whether forward_argmax serves this batch (its sampled rows within the model's argmax_rows)."""
        return 0 < len(prepared.logits_indices) <= self.model.argmax_rows

    @torch.inference_mode()
    def forward_argmax(self, prepared: PreparedBatch) -> list[int]:
        """The greedy tokens of forward's logits, taken inside the LM head's kernel."""
        return self.model(prepared.input_ids, prepared.positions, self.kv_caches, prepared.meta,
                          prepared.logits_indices, argmax=True)


def batch_tensors(batch: ScheduledBatch, block_size: int, device: torch.device) -> PreparedBatch:
    """The batch as the forward pass reads it: token ids, positions, attention metadata. Reads
    only block tables and token positions: no model, no cache."""
    bs = block_size
    ids, positions, slots, logits_indices = [], [], [], []
    starts, query_lens, seq_lens, tables = [0], [], [], []
    for chunk in batch.prefills:
        seq, start, n = chunk.seq, chunk.seq.num_computed, chunk.num_tokens
        end = start + n
        ids += seq.tokens[start:end]
        positions += range(start, end)
        table = seq.block_table
        slots += [table[p // bs] * bs + p % bs for p in range(start, end)]
        starts.append(starts[-1] + n)
        query_lens.append(n)
        seq_lens.append(end)
        tables.append(_cached_blocks(table, end, bs))
        if end == len(seq.tokens):
            logits_indices.append(len(ids) - 1)
    # Decodes, one token each, after the prefill chunks (batch.chunks' order): the same as above
    # without a slice, a range and a comprehension per request, which after a forward pass has
    # flushed the caches cost 12 us of a 16-decode batch's 123 (bf16, Xeon with AMX).
    for seq in batch.decodes:
        start = seq.num_computed
        ids.append(seq.tokens[start])
        positions.append(start)
        table = seq.block_table
        slots.append(table[start // bs] * bs + start % bs)
        starts.append(starts[-1] + 1)
        query_lens.append(1)
        seq_lens.append(start + 1)
        # _cached_blocks inlined: as a call it added 1.4 us to a 16-decode batch's 28 (hot), inline 0.5.
        cached = start // bs + 1
        tables.append(table if len(table) == cached else table[:cached])
        if start + 1 == len(seq.tokens):
            logits_indices.append(len(ids) - 1)
    width = max(map(len, tables))
    ints = array("i", starts + seq_lens)
    for table in tables:
        ints.extend(table)
        ints.extend([0] * (width - len(table)))
    query_start_loc, seq_lens_t, block_tables = _tensors(
        ints, torch.int32, [len(starts), len(seq_lens), len(tables) * width], device)
    input_ids, positions_t, slot_mapping, logits_t = _tensors(
        array("q", ids + positions + slots + logits_indices), torch.int64,
        [len(ids), len(ids), len(ids), len(logits_indices)], device)
    meta = AttentionMetadata(
        num_prefills=len(batch.prefills), num_decodes=len(batch.decodes),
        num_prefill_tokens=batch.num_prefill_tokens,
        query_start_loc=query_start_loc, seq_lens=seq_lens_t, block_tables=block_tables.view(len(tables), width),
        slot_mapping=slot_mapping, query_lens_host=query_lens, seq_lens_host=seq_lens,
        max_query_len=max(query_lens))
    return PreparedBatch(input_ids, positions_t, meta, logits_t)


def _cached_blocks(table: list[int], num_tokens: int, block_size: int) -> list[int]:
    """The blocks of a request's first ``num_tokens`` tokens: all it holds under the paged
    schedulers; under orca and static, which reserve max_model_len tokens' blocks from admission,
    the prefix, so that the tables stay as wide as the longest context rather than max_model_len."""
    n = -(-num_tokens // block_size)
    return table if len(table) == n else table[:n]


def _tensors(buf: array, dtype: torch.dtype, lengths: list[int], device: torch.device) -> list[torch.Tensor]:
    """Consecutive parts of ``buf`` of these lengths, as tensors on ``device`` (on the CPU they share
    the array's memory).

    torch.frombuffer reads the array as it is, where torch.tensor over a list checks every element
    (34 us for a 600-token prefill list, 4 us for a decode batch's few); one op repeated, not one
    tensor sliced seven ways, because after a forward pass each distinct op first pays for its code
    coming back into the caches. Measured: 1.7x hot and 1.3x cold on a 256-token prefill chunk, 1.4x
    hot and even cold on a decode batch (benchmarks/RESULTS.md)."""
    out, offset = [], 0
    for n in lengths:
        t = (torch.frombuffer(buf, dtype=dtype, count=n, offset=offset * buf.itemsize) if n
             else torch.empty(0, dtype=dtype))
        out.append(t if device.type == "cpu" else t.to(device))
        offset += n
    return out
