"""Attention through the Triton kernels: one launch a work kind (prefill chunks, decodes) per layer for
the whole hybrid batch, reading each request's context straight from its paged blocks; the launches
planned once an iteration from the batch's host lengths, and, for CUDA graphs, captured at their
largest (attention_plan.py)."""
from __future__ import annotations

import torch

try:
    from sarathi_kernels.attention_plan import (
        AttentionPlan,
        TileConfig,
        WorkTiles,
        plan_batch,
        plan_graph,
        prefill_tile_choices,
    )
    from sarathi_kernels.kv_cache import write_kv_cache
    from sarathi_kernels.occupancy import GpuLimits, device_limits
    from sarathi_kernels.paged_attention import paged_attention
    from sarathi_kernels.split_merge import plan_row, split_counts_buffer
    from sarathi_kernels.split_rule import DEFAULT_RULE, SplitRule
except ModuleNotFoundError as e:  # Triton is the gpu extra's: a CPU install has none
    if e.name != "triton":
        raise
    raise ModuleNotFoundError('attention=triton needs Triton, which is not installed: pip install -e ".[gpu]" '
                              "(or attention=torch)", name="triton") from None

from sarathi_lab.attention.backend import AttentionBackend
from sarathi_lab.attention.metadata import AttentionMetadata


class TritonAttention(AttentionBackend):
    """``tiles``/``rule``: the tiles of each work kind and the split rule (default: attention_plan's and
    split_rule's); ``limits``: the GPU planned for (default: the cache's device; none on a CPU, where
    nothing splits)."""

    name = "triton"

    def __init__(self, tiles: WorkTiles | None = None, rule: SplitRule = DEFAULT_RULE,
                 limits: GpuLimits | None = None):
        self.tiles, self.rule, self.limits = tiles, rule, limits

    def _limits(self, k_cache: torch.Tensor) -> GpuLimits | None:
        return self.limits if self.limits is not None else device_limits(k_cache.device)

    def batch_plan(self, meta: AttentionMetadata, num_heads: int, k_cache: torch.Tensor) -> AttentionPlan:
        """The batch's launches, from its host lengths, planned once (kept on ``meta.plan``); a CUDA
        graph's captured batch holds its graph's plan there instead."""
        if not isinstance(meta.plan, AttentionPlan):
            meta.plan = plan_batch(meta.query_lens_host, meta.seq_lens_host, num_heads, k_cache.shape[2],
                                   num_prefills=meta.num_prefills, element_size=k_cache.element_size(),
                                   limits=self._limits(k_cache),
                                   tiles=self.tiles, rule=self.rule)
        return meta.plan

    def graph_plan(self, tokens: int, requests: int, num_heads: int, k_cache: torch.Tensor, *, max_seq_len: int,
                   prefill_tiles: TileConfig | None, fewest_tokens: int, fewest_decodes: int,
                   split_counts: torch.Tensor) -> AttentionPlan:
        """The launches a CUDA graph captures (attention_plan.plan_graph), reading their split counts
        from ``split_counts`` (``graph_split_counts``)."""
        return plan_graph(tokens, requests, num_heads, k_cache.shape[2], max_seq_len=max_seq_len,
                          prefill_tiles=prefill_tiles, fewest_tokens=fewest_tokens, fewest_decodes=fewest_decodes,
                          element_size=k_cache.element_size(), limits=self._limits(k_cache), tiles=self.tiles,
                          rule=self.rule, split_counts=split_counts)

    def prefill_tile_choices(self, num_heads: int, k_cache: torch.Tensor) -> list[tuple[TileConfig, int]]:
        """Every prefill tile a batch's plan may ask for, each with the fewest tokens of the batch's
        longest chunk that ask for it, ascending."""
        return prefill_tile_choices(num_heads, k_cache.shape[2], k_cache.element_size(), self.tiles)

    @staticmethod
    def graph_split_counts(device: torch.device) -> torch.Tensor:
        return split_counts_buffer(2, device)

    @staticmethod
    def set_split_counts(split_counts: torch.Tensor, plan: AttentionPlan) -> None:
        """A replay's split counts and requests (``plan``'s, the batch's eager plan) into its graph's
        device integers."""
        for slot, values in enumerate(plan.device_rows()):
            split_counts[slot].copy_(plan_row(split_counts.device, values), non_blocking=True)

    def write_kv(self, key, value, k_cache, v_cache, meta: AttentionMetadata) -> None:
        write_kv_cache(key, value, k_cache, v_cache, meta.slot_mapping)

    def attend(self, query, k_cache, v_cache, meta: AttentionMetadata, scale: float):
        plan = self.batch_plan(meta, query.shape[1], k_cache)
        return paged_attention(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                               scale, plan=plan)
