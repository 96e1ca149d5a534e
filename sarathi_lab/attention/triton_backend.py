"""Attention through the Triton kernels: one launch per layer for the whole hybrid batch, reading each
request's context straight from its paged blocks."""
from __future__ import annotations

try:
    from sarathi_kernels.kv_cache import write_kv_cache
    from sarathi_kernels.paged_attention import paged_attention
except ModuleNotFoundError as e:  # Triton is the gpu extra's: a CPU install has none
    if e.name != "triton":
        raise
    raise ModuleNotFoundError('attention=triton needs Triton, which is not installed: pip install -e ".[gpu]" '
                              "(or attention=torch)", name="triton") from None

from sarathi_lab.attention.backend import AttentionBackend
from sarathi_lab.attention.metadata import AttentionMetadata


class TritonAttention(AttentionBackend):
    name = "triton"

    def write_kv(self, key, value, k_cache, v_cache, meta: AttentionMetadata) -> None:
        write_kv_cache(key, value, k_cache, v_cache, meta.slot_mapping)

    def attend(self, query, k_cache, v_cache, meta: AttentionMetadata, scale: float):
        # No max_seq_len from seq_lens_host: a CUDA graph is captured over placeholder lengths, and the
        # kernel's default (the block table's width) bounds the longest context in graphs and eager runs.
        return paged_attention(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                               scale, max_query_len=meta.max_query_len)
