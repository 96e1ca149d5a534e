"""Attention through the Triton kernels: one launch per layer for the whole hybrid batch, reading each
request's context straight from its paged blocks; with ``hybrid="pod"`` a batch of prefills beside
decodes runs co-scheduled (sarathi_kernels/pod_attention.py), planned once per iteration."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sarathi_lab.attention.backend import AttentionBackend, register_backend
from sarathi_lab.attention.metadata import AttentionMetadata
from sarathi_lab.tuned_kernels import table_for

# The kernels, imported when the backend is first made rather than when it registers: Triton is the
# gpu extra's, and a CPU install without it still lists this backend.
write_kv_cache = paged_attention = rope_write_kv = pod_attention = plan_batch = PodWork = item_capacity = None


def _import_kernels() -> None:
    global write_kv_cache, paged_attention, rope_write_kv, pod_attention, plan_batch, PodWork, item_capacity
    try:
        from sarathi_kernels.kv_cache import write_kv_cache
        from sarathi_kernels.paged_attention import paged_attention
        from sarathi_kernels.pod_attention import PodWork, plan_batch, pod_attention
        from sarathi_kernels.pod_plan import item_capacity
        from sarathi_kernels.rope_kv import rope_write_kv
    except ModuleNotFoundError as e:
        if e.name != "triton":
            raise
        raise ModuleNotFoundError('attention=triton needs Triton, which is not installed: pip install -e '
                                  '".[gpu]" (or attention=torch)', name="triton") from None


@dataclass
class PodLaunch:
    """An iteration's co-scheduled plan, shared by every layer (the same lengths, the same buffers)."""

    plan: Any   # sarathi_kernels.pod_attention.PodPlan
    work: Any   # sarathi_kernels.pod_attention.PodWork
    num_warps: int


@register_backend("triton")
class TritonAttention(AttentionBackend):
    replayable = True
    devices = ("cuda",)
    preferred_on = ("cuda",)

    def __init__(self, hybrid: str = "sequential", fuse_rope: bool = True):
        if paged_attention is None:
            _import_kernels()
        self.hybrid = hybrid
        # Kept across iterations and grown as batches grow: the plan's buffers.
        self._work = None
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

    def _pod(self, query: torch.Tensor, k_cache: torch.Tensor, meta: AttentionMetadata) -> PodLaunch:
        """The iteration's plan: made by its first layer from the host's lengths, reused by the others."""
        if isinstance(meta.plan, PodLaunch):
            return meta.plan
        plan, warps = plan_batch(meta.query_lens_host, meta.seq_lens_host, query.shape[1], k_cache.shape[2],
                                 query.shape[2], query.element_size(), query.device)
        work = self._work
        if work is None or work.programs != plan.programs or work.capacity < len(plan.items) \
                or work.items.device != query.device:
            # Room for any batch of this many tokens and requests: the buffers grow rarely.
            capacity = item_capacity(query.shape[0], len(meta.seq_lens_host), k_cache.shape[2], plan.tiles)
            work = self._work = PodWork(plan.programs, capacity, query.device)
        work.load(plan)
        meta.plan = PodLaunch(plan, work, warps)
        return meta.plan

    def attend(self, query, k_cache, v_cache, meta: AttentionMetadata, scale: float):
        # Only a batch with both kinds has anything to overlap. A forward being captured runs the
        # sequential kernel: its lengths are placeholders, and a graph replays what it captured.
        if self.hybrid == "pod" and meta.num_prefills and meta.num_decodes and not _capturing(query.device):
            launch = self._pod(query, k_cache, meta)
            return pod_attention(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                                 launch.plan, launch.work, scale, num_warps=launch.num_warps)
        # No max_seq_len from seq_lens_host: a CUDA graph is captured over placeholder lengths, and the
        # kernel's default (the block table's width) bounds the longest context in graphs and eager runs.
        return paged_attention(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                               scale, max_query_len=meta.max_query_len, **tiles(query.device, meta).launch_kwargs())


def tiles(device, meta: AttentionMetadata):
    """The tuned tile config of the batch's work kind on ``device``: decode where every row is one token."""
    return table_for(device).tiles("decode" if meta.max_query_len == 1 else "prefill")


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()
