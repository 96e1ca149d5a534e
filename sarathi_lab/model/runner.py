"""Turns a scheduled batch into tensors, runs the model over them, returns the sampled rows' logits."""
from __future__ import annotations

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


def batch_tensors(batch: ScheduledBatch, block_size: int, device: torch.device) -> PreparedBatch:
    """The batch as the forward pass reads it: token ids, positions, attention metadata. Reads
    only block tables and token positions: no model, no cache."""
    bs = block_size
    ids, positions, slots, query_lens, seq_lens, tables = [], [], [], [], [], []
    logits_indices = []
    for chunk in batch.chunks:
        seq, start = chunk.seq, chunk.seq.num_computed
        end = start + chunk.num_tokens
        ids += seq.tokens[start:end]
        pos = range(start, end)
        positions += pos
        table = seq.block_table
        slots += [table[p // bs] * bs + p % bs for p in pos]
        query_lens.append(chunk.num_tokens)
        seq_lens.append(end)
        tables.append(table)
        if chunk.samples:
            logits_indices.append(len(ids) - 1)
    width = max(len(t) for t in tables)
    padded = [t + [0] * (width - len(t)) for t in tables]
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    tensor = lambda data, dtype: torch.tensor(data, dtype=dtype, device=device)  # noqa: E731
    meta = AttentionMetadata(
        num_prefills=len(batch.prefills), num_decodes=len(batch.decodes),
        num_prefill_tokens=batch.num_prefill_tokens,
        query_start_loc=tensor(starts, torch.int32), seq_lens=tensor(seq_lens, torch.int32),
        block_tables=tensor(padded, torch.int32), slot_mapping=tensor(slots, torch.int64),
        query_lens_host=query_lens, seq_lens_host=seq_lens,
        max_query_len=max(query_lens))
    return PreparedBatch(tensor(ids, torch.int64), tensor(positions, torch.int64), meta,
                         tensor(logits_indices, torch.int64))
