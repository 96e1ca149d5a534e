"""Attention through the Triton kernels: one launch per layer for the whole hybrid batch, reading each
request's context straight from its paged blocks."""
from __future__ import annotations

from sarathi_lab.attention.backend import AttentionBackend, register_backend
from sarathi_lab.attention.metadata import AttentionMetadata

# The kernels, imported when the backend is first made rather than when it registers: Triton is the
# gpu extra's, and a CPU install without it still lists this backend.
write_kv_cache = paged_attention = None


@register_backend("triton")
class TritonAttention(AttentionBackend):
    replayable = True
    devices = ("cuda",)
    preferred_on = ("cuda",)

    def __init__(self):
        global write_kv_cache, paged_attention
        if paged_attention is None:
            try:
                from sarathi_kernels.kv_cache import write_kv_cache
                from sarathi_kernels.paged_attention import paged_attention
            except ModuleNotFoundError as e:
                if e.name != "triton":
                    raise
                raise ModuleNotFoundError('attention=triton needs Triton, which is not installed: pip install -e '
                                          '".[gpu]" (or attention=torch)', name="triton") from None

    def write_kv(self, key, value, k_cache, v_cache, meta: AttentionMetadata) -> None:
        write_kv_cache(key, value, k_cache, v_cache, meta.slot_mapping)

    def attend(self, query, k_cache, v_cache, meta: AttentionMetadata, scale: float):
        # No max_seq_len from seq_lens_host: a CUDA graph is captured over placeholder lengths, and the
        # kernel's default (the block table's width) bounds the longest context in graphs and eager runs.
        return paged_attention(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                               scale, max_query_len=meta.max_query_len)
