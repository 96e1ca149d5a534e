"""A batch as the driver sends it: an int64 header and one packed buffer, never pickled."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from sarathi_lab.attention import AttentionMetadata
from sarathi_lab.model.runner import PreparedBatch, pack_layout, packed, pageable, unpacked

# Header slots.
(OP, TOKENS, REQUESTS, LOGITS, TABLE_WIDTH, PREFILLS, DECODES, PREFILL_TOKENS, MAX_QUERY,
 NBYTES) = range(10)
HEADER_LEN = 10
# header[OP]; TIMELINE: send the driver your stage's times.
STEP, BUILD, STOP, TIMELINE = 1, 2, 3, 4


@dataclass(frozen=True)
class WireBatch:
    header: torch.Tensor  # int64 [HEADER_LEN]
    payload: torch.Tensor  # uint8 [header[NBYTES]]


def command(op: int) -> torch.Tensor:
    header = torch.zeros(HEADER_LEN, dtype=torch.int64)
    header[OP] = op
    return header


def encode(prepared: PreparedBatch) -> WireBatch:
    meta = prepared.meta
    tables = meta.block_tables
    longs = [prepared.input_ids, prepared.positions, meta.slot_mapping, prepared.logits_indices]
    ints = [meta.query_start_loc, meta.seq_lens, tables.reshape(-1)]
    payload, _ = packed([t.numpy() for t in longs], [t.numpy() for t in ints], pageable)
    header = torch.tensor([STEP, len(prepared.input_ids), meta.num_prefills + meta.num_decodes,
                           len(prepared.logits_indices), tables.shape[1], meta.num_prefills,
                           meta.num_decodes, meta.num_prefill_tokens, meta.max_query_len,
                           payload.numel()], dtype=torch.int64)
    return WireBatch(header, payload)


def decode(header: list[int], payload: torch.Tensor, device: torch.device) -> PreparedBatch:
    tokens, requests = header[TOKENS], header[REQUESTS]
    where = pack_layout([tokens, tokens, tokens, header[LOGITS]],
                        [requests + 1, requests, requests * header[TABLE_WIDTH]])[0]
    host = unpacked(payload, where)
    flat = payload if device.type == "cpu" else payload.to(device, non_blocking=True)
    input_ids, positions, slots, logits, query_start_loc, seq_lens, tables = (
        host if device.type == "cpu" else unpacked(flat, where))
    starts = host[4].tolist()
    query_lens = [b - a for a, b in itertools.pairwise(starts)]
    meta = AttentionMetadata(
        num_prefills=header[PREFILLS], num_decodes=header[DECODES],
        num_prefill_tokens=header[PREFILL_TOKENS],
        query_start_loc=query_start_loc, seq_lens=seq_lens,
        block_tables=tables.view(header[REQUESTS], header[TABLE_WIDTH]), slot_mapping=slots,
        query_lens_host=query_lens, seq_lens_host=host[5].tolist(), max_query_len=header[MAX_QUERY])
    return PreparedBatch(input_ids, positions, meta, logits)
