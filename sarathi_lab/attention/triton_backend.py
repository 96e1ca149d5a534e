"""Attention through the Triton kernels: one launch per layer for the whole hybrid batch, reading each
request's context straight from its paged blocks."""
from __future__ import annotations

try:
    from sarathi_kernels.kv_cache import write_kv_cache
    from sarathi_kernels.paged_attention import paged_attention
    from sarathi_kernels.rope_kv import rope_write_kv
except ModuleNotFoundError as e:  # Triton is the gpu extra's: a CPU install has none
    if e.name != "triton":
        raise
    raise ModuleNotFoundError('attention=triton needs Triton, which is not installed: pip install -e ".[gpu]" '
                              "(or attention=torch)", name="triton") from None

from sarathi_lab.attention.backend import AttentionBackend
from sarathi_lab.attention.metadata import AttentionMetadata
from sarathi_lab.tuned_kernels import table_for


class TritonAttention(AttentionBackend):
    name = "triton"

    def __init__(self, fuse_rope: bool = True):
        # False: RoPE and the cache write as two launches (the kernel count's "before").
        self.fuse_rope = fuse_rope

    def rope_write_kv(self, rotary, positions, qkv, num_heads, num_kv_heads, k_cache, v_cache,
                      meta: AttentionMetadata):
        if not self.fuse_rope:
            return super().rope_write_kv(rotary, positions, qkv, num_heads, num_kv_heads, k_cache, v_cache, meta)
        # One launch for RoPE and the cache write. The softmax scale stays with attention, which folds it
        # into its exp2 argument at no cost: scaling q here would add a rounding and save nothing.
        cos, sin = rotary.tables(positions.device)
        return rope_write_kv(qkv, positions, cos, sin, k_cache, v_cache, meta.slot_mapping, num_heads, num_kv_heads)

    def write_kv(self, key, value, k_cache, v_cache, meta: AttentionMetadata) -> None:
        write_kv_cache(key, value, k_cache, v_cache, meta.slot_mapping)

    def attend(self, query, k_cache, v_cache, meta: AttentionMetadata, scale: float):
        # No max_seq_len from seq_lens_host: a CUDA graph is captured over placeholder lengths, and the
        # kernel's default (the block table's width) bounds the longest context in graphs and eager runs.
        return paged_attention(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                               scale, max_query_len=meta.max_query_len, **tiles(query.device, meta).launch_kwargs())


def tiles(device, meta: AttentionMetadata):
    """The tuned tile config of the batch's work kind on ``device``: decode where every row is one token."""
    return table_for(device).tiles("decode" if meta.max_query_len == 1 else "prefill")
