"""Attention timed alone: a paged batch, and a prompt prefilled whole against in chunks."""
from __future__ import annotations

import statistics

import torch

from sarathi_lab.attention import AttentionMetadata, make_backend
from sarathi_lab.engine.batch import ScheduledBatch, ScheduledChunk
from sarathi_lab.engine.block_manager import blocks_for
from sarathi_lab.engine.sequence import Sequence
from sarathi_lab.engine.timer import time_interleaved
from sarathi_lab.model.runner import batch_tensors

LLAMA_HEADS, LLAMA_KV_HEADS, LLAMA_HEAD_DIM = 32, 8, 128


def paged_batch(query_lens: list[int], seq_lens: list[int], *, num_prefills: int, block_size: int,
                device: str | torch.device = "cpu", block_tables: torch.Tensor | None = None,
                ) -> tuple[AttentionMetadata, int]:
    """Without ``block_tables``, scattered blocks, one unreferenced: stray reads are caught."""
    if any(q != 1 for q in query_lens[num_prefills:]):
        raise ValueError(f"query_lens={query_lens}: a decode (after the first {num_prefills}) "
                         f"computes one token")
    need = [blocks_for(s, block_size) for s in seq_lens]
    if block_tables is None:
        num_blocks = sum(need) + 1
        tables = [t.tolist() for t in torch.randperm(num_blocks)[: sum(need)].split(need)]
    else:
        num_blocks = int(block_tables.max()) + 1
        tables = [row[:n].tolist() for row, n in zip(block_tables, need)]
    batch = ScheduledBatch()
    for i, (q_len, seq_len, table) in enumerate(zip(query_lens, seq_lens, tables)):
        seq = Sequence(i, [0] * seq_len, max_new_tokens=1, num_computed=seq_len - q_len,
                       block_table=table)
        if i < num_prefills:
            batch.prefills.append(ScheduledChunk(seq, q_len))
        else:
            batch.decodes.append(seq)
    return batch_tensors(batch, block_size, torch.device(device)).meta, num_blocks


def context_slot_mapping(meta: AttentionMetadata, block_size: int) -> torch.Tensor:
    tables = meta.block_tables.cpu()
    slots = [tables[i, torch.arange(s) // block_size].long() * block_size
             + torch.arange(s) % block_size
             for i, s in enumerate(meta.seq_lens_host)]
    return torch.cat(slots).to(meta.slot_mapping.device)


def paged_cache(values: torch.Tensor, slots: torch.Tensor, num_blocks: int,
                block_size: int) -> torch.Tensor:
    """NaN in every other slot, so that a read of one shows."""
    cache = torch.full((num_blocks, block_size, *values.shape[1:]), float("nan"),
                       dtype=values.dtype, device=values.device)
    cache.view(-1, *values.shape[1:])[slots] = values
    return cache


def measure_reread(seq_len: int, chunk: int, *, num_heads: int = LLAMA_HEADS,
                   num_kv_heads: int = LLAMA_KV_HEADS, head_dim: int = LLAMA_HEAD_DIM,
                   dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                   attention: str = "auto", block_size: int = 16, reps: int = 5) -> dict:
    """Every call after an L2 flush, as in a real model, timed by CUDA events with the GPU kept
    ahead of the host: a small chunk's kernel takes microseconds."""
    device = torch.device(device)
    backend = make_backend(attention, device)
    blocks = blocks_for(seq_len, block_size)
    table = torch.arange(blocks, dtype=torch.int32)[None]
    k_cache = torch.randn(blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device)
    v_cache = torch.randn_like(k_cache)
    query = torch.randn(seq_len, num_heads, head_dim, dtype=dtype, device=device)
    scale = head_dim ** -0.5

    def step(start: int, end: int):
        meta, _ = paged_batch([end - start], [end], num_prefills=1, block_size=block_size,
                              device=device, block_tables=table)
        q = query[start:end]
        return meta, lambda: backend.attend(q, k_cache, v_cache, meta, scale)

    whole_meta, whole_fn = step(0, seq_len)
    chunks = [step(s, min(s + chunk, seq_len)) for s in range(0, seq_len, chunk)]
    # Every chunk beside the whole prompt in each round: a speed drift falls on both.
    calls = {"whole": whole_fn} | {f"chunk{i}": fn for i, (_, fn) in enumerate(chunks)}
    times = time_interleaved(calls, reps, device, warmup=1)
    whole_ms = statistics.median(times["whole"])
    chunked_ms = sum(statistics.median(times[f"chunk{i}"]) for i in range(len(chunks)))
    bytes_per_token = 2 * num_kv_heads * head_dim * k_cache.element_size()
    whole_bytes = whole_meta.kv_tokens_read * bytes_per_token
    chunked_bytes = sum(meta.kv_tokens_read for meta, _ in chunks) * bytes_per_token
    row = {
        "seq_len": seq_len, "chunk": chunk, "num_chunks": len(chunks),
        "whole_ms": whole_ms, "chunked_ms": chunked_ms, "time_ratio": chunked_ms / whole_ms,
        "kv_read_whole_MB": whole_bytes / 1e6, "kv_read_chunked_MB": chunked_bytes / 1e6,
        "kv_read_ratio": chunked_bytes / whole_bytes,
        "backend": backend.name, "device": device.type, "dtype": str(dtype).removeprefix("torch."),
    }
    if device.type == "cuda":
        row["whole_GBps"] = whole_bytes / whole_ms / 1e6
        row["chunked_GBps"] = chunked_bytes / chunked_ms / 1e6
    return row
