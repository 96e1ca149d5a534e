"""How much attention time chunked prefill adds by re-reading the KV cache.

A prompt of L tokens prefilled in chunks of C makes chunk k attend over all k * C tokens before it,
so the cache is read about (L / C + 1) / 2 times instead of once. This times one layer's attention
for the chunked and the whole prefill and counts the KV bytes each reads, analytically: every
attention call reads its request's whole context once (``AttentionMetadata.kv_tokens_read``).

    python -m sarathi_lab.bench.attention_reread --smoke
    python -m sarathi_lab.bench.attention_reread --seq-lens 2048,4096 --chunks 256,512 --out reread.csv
"""
from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from sarathi_lab.attention import AttentionMetadata, make_backend
from sarathi_lab.bench.common import (
    add_common_args,
    describe_machine,
    median_time,
    print_table,
    resolve_dtype,
    setup_threads,
    warn_if_loaded,
)

# Llama-3-8B attention: 32 query heads sharing 8 KV heads of 128 dims.
LLAMA_HEADS, LLAMA_KV_HEADS, LLAMA_HEAD_DIM = 32, 8, 128


def paged_batch(query_lens: list[int], seq_lens: list[int], *, num_prefills: int, block_size: int,
                device: str | torch.device = "cpu", block_tables: torch.Tensor | None = None,
                ) -> tuple[AttentionMetadata, int]:
    """Metadata for a hybrid batch, and the number of cache blocks it needs.

    Without ``block_tables`` each request gets randomly scattered blocks, and one block is left
    unreferenced so a kernel reading outside its tables can be caught.
    """
    need = [-(-s // block_size) for s in seq_lens]
    if block_tables is None:
        num_blocks = sum(need) + 1
        ids = torch.randperm(num_blocks)[: sum(need)].split(need)
        block_tables = torch.zeros(len(need), max(need, default=1), dtype=torch.int32)
        for row, blocks in zip(block_tables, ids):
            row[: len(blocks)] = blocks
    else:
        num_blocks = int(block_tables.max()) + 1
    block_tables = block_tables.to(torch.int32)
    slots = []
    for table, q_len, seq_len in zip(block_tables, query_lens, seq_lens):
        pos = torch.arange(seq_len - q_len, seq_len)
        slots.append(table[pos // block_size].long() * block_size + pos % block_size)
    starts = torch.tensor([0, *query_lens]).cumsum(0)
    meta = AttentionMetadata(
        num_prefills=num_prefills,
        num_decodes=len(query_lens) - num_prefills,
        num_prefill_tokens=sum(query_lens[:num_prefills]),
        query_start_loc=starts.to(device=device, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=block_tables.to(device),
        slot_mapping=torch.cat(slots).to(device) if slots else torch.zeros(0, dtype=torch.long, device=device),
        query_lens_host=list(query_lens),
        seq_lens_host=list(seq_lens),
        max_query_len=max(query_lens, default=0),
    )
    return meta, num_blocks


def context_slot_mapping(meta: AttentionMetadata, block_size: int) -> torch.Tensor:
    """Cache slots of every context position (cached prefix and this step's tokens) of every request."""
    tables = meta.block_tables.cpu()
    slots = [tables[i, torch.arange(s) // block_size].long() * block_size + torch.arange(s) % block_size
             for i, s in enumerate(meta.seq_lens_host)]
    return torch.cat(slots).to(meta.slot_mapping.device)


def _timer(device: torch.device, reps: int) -> Callable[[Callable[[], object]], float]:
    """Median milliseconds of fn(). On CUDA ``do_bench`` flushes L2 before every call, as the other
    layers of a real model would between two chunks of one request."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, return_mode="median")
    return lambda fn: median_time(fn, reps) * 1e3


def copy_bandwidth_gbps(device: torch.device, nbytes: int = 1 << 28) -> float:
    """Device-to-device copy bandwidth (read + write), the roofline KV reads are compared against."""
    from triton.testing import do_bench

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / do_bench(lambda: dst.copy_(src), return_mode="median") / 1e6


def measure_reread(seq_len: int, chunk: int, *, num_heads: int = LLAMA_HEADS, num_kv_heads: int = LLAMA_KV_HEADS,
                   head_dim: int = LLAMA_HEAD_DIM, dtype: torch.dtype = torch.float32,
                   device: str | torch.device = "cpu", attention: str = "auto", block_size: int = 16,
                   reps: int = 5) -> dict:
    """One layer's attention for an L-token prompt: whole prefill vs chunks of ``chunk`` tokens."""
    device = torch.device(device)
    backend = make_backend(attention, device)
    blocks = -(-seq_len // block_size)
    table = torch.arange(blocks, dtype=torch.int32)[None]
    k_cache = torch.randn(blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device)
    v_cache = torch.randn_like(k_cache)
    query = torch.randn(seq_len, num_heads, head_dim, dtype=dtype, device=device)
    scale = head_dim ** -0.5

    def step(start: int, end: int):
        meta, _ = paged_batch([end - start], [end], num_prefills=1, block_size=block_size, device=device,
                              block_tables=table)
        q = query[start:end]
        return meta, lambda: backend.attend(q, k_cache, v_cache, meta, scale)

    time_ms = _timer(device, reps)
    whole_meta, whole_fn = step(0, seq_len)
    chunks = [step(s, min(s + chunk, seq_len)) for s in range(0, seq_len, chunk)]
    whole_ms = time_ms(whole_fn)
    # Each chunk is timed on its own (cold cache on CUDA) and the medians summed.
    chunked_ms = sum(time_ms(fn) for _, fn in chunks)
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


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--seq-lens", type=_ints, default=[1024, 2048, 4096], help="prompt lengths L, comma list")
    parser.add_argument("--chunks", type=_ints, default=[128, 256, 512, 1024], help="chunk sizes C, comma list")
    parser.add_argument("--attention", choices=["auto", "torch", "triton"], default="auto",
                        help="auto: triton on CUDA, torch elsewhere")
    parser.add_argument("--heads", type=int, default=LLAMA_HEADS)
    parser.add_argument("--kv-heads", type=int, default=LLAMA_KV_HEADS)
    parser.add_argument("--head-dim", type=int, default=LLAMA_HEAD_DIM)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions on CPU (CUDA uses do_bench)")
    add_common_args(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.seq_lens, args.chunks, args.reps = [256, 512], [64, 128], 2
    setup_threads(args.threads)
    device, dtype = torch.device(args.device), resolve_dtype(args)
    warn_if_loaded()
    rows = [measure_reread(L, C, num_heads=args.heads, num_kv_heads=args.kv_heads, head_dim=args.head_dim,
                           dtype=dtype, device=device, attention=args.attention, block_size=args.block_size,
                           reps=args.reps)
            for L in args.seq_lens for C in args.chunks if C <= L]
    print(describe_machine())
    if device.type == "cuda":
        copy_gbps = copy_bandwidth_gbps(device)
        print(f"# device copy bandwidth: {copy_gbps:.0f} GB/s")
        for row in rows:
            for kind in ("whole", "chunked"):
                row[f"{kind}_frac_of_copy_bw"] = row[f"{kind}_GBps"] / copy_gbps
    return print_table(rows, args.out)


if __name__ == "__main__":
    main()
