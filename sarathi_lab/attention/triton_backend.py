"""Attention through the Triton kernels: one launch a work kind (prefill chunks, decodes) per layer,
planned once an iteration from the batch's host lengths (attention_plan.py), with tiles and split
rule from the device's tuned table where it has them; ``hybrid="pod"`` co-schedules a hybrid batch
where that table measured it faster (co_schedule.py, sarathi_kernels/pod_attention.py)."""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from sarathi_lab.attention.backend import AttentionBackend, register_backend
from sarathi_lab.attention.co_schedule import NEVER, CoScheduleRule
from sarathi_lab.attention.metadata import AttentionMetadata
from sarathi_lab.tuned_kernels import table_for

log = logging.getLogger(__name__)
# The tables whose split-rule knobs the rule refused, warned of once each.
_REFUSED_RULES: set[str] = set()
# The kernels, imported when the backend is first made rather than when it registers: Triton is the
# gpu extra's, and a CPU install without it still lists this backend.
# The kernels called by name are module globals, as a test's spy replaces them.
k = None  # the kernels' namespace, once imported
write_kv_cache = paged_attention = rope_write_kv = pod_attention = None


def kernels() -> SimpleNamespace:
    global k, write_kv_cache, paged_attention, rope_write_kv, pod_attention
    if k is None:
        try:
            from sarathi_kernels import attention_plan, occupancy, pod_plan, split_merge, split_rule
            from sarathi_kernels import pod_attention as pod
            from sarathi_kernels.kv_cache import write_kv_cache
            from sarathi_kernels.paged_attention import paged_attention
            from sarathi_kernels.rope_kv import rope_write_kv
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] != "triton":
                raise
            raise ModuleNotFoundError('attention=triton needs Triton, which is not installed: pip install -e '
                                      '".[gpu]" (or attention=torch)', name="triton") from None
        k = SimpleNamespace(plan=attention_plan, occupancy=occupancy, pod=pod, pod_plan=pod_plan,
                            split_merge=split_merge, split_rule=split_rule)
        pod_attention = pod.pod_attention
    return k


@dataclass
class PodLaunch:
    """An iteration's co-scheduled plan, shared by every layer (the same lengths, the same buffers)."""

    plan: Any   # sarathi_kernels.pod_attention.PodPlan
    work: Any   # sarathi_kernels.pod_attention.PodWork
    num_warps: int


@register_backend("triton")
class TritonAttention(AttentionBackend):
    """``limits``: the GPU planned for (default: the cache's device; none on a CPU, where nothing
    splits); ``tiles``, ``rule``, ``co_schedule`` (None: the device's tuned table's) are set by
    tests and sweeps."""

    replayable = True
    devices = ("cuda",)
    preferred_on = ("cuda",)

    def __init__(self, hybrid: str = "sequential", limits=None):
        kernels()
        self.hybrid, self.limits = hybrid, limits
        self.tiles = self.rule = self.co_schedule = None
        # False: RoPE and the cache write as two launches (the kernel count's "before").
        self.fuse_rope = True
        # Kept across iterations and grown as batches grow: the co-scheduled plan's buffers.
        self._work = None

    def _limits(self, k_cache: torch.Tensor):
        return self.limits if self.limits is not None else k.occupancy.device_limits(k_cache.device)

    def _tiles(self, k_cache: torch.Tensor):
        """Given ones, else the kernels' defaults with the device table's (None: the defaults)."""
        if self.tiles is not None:
            return self.tiles
        table = table_for(k_cache.device)
        if not table.attention:
            return None
        base = k.plan.default_tiles(k_cache.element_size())
        tuned = {kind: table.tiles(kind).launch_kwargs() for kind in ("decode", "prefill")}
        decode, prefill = (dataclasses.replace(getattr(base, kind), **launch)
                           for kind, launch in tuned.items())
        return k.plan.WorkTiles(decode=decode, prefill=prefill, tall_prefill=base.tall_prefill)

    def _rule(self, k_cache: torch.Tensor):
        """The given rule, else the device's tuned table's (split_rule's defaults where it has none)."""
        if self.rule is not None:
            return self.rule
        table = table_for(k_cache.device)
        if not table.split_rule:
            return k.split_rule.DEFAULT_RULE
        try:
            return k.split_rule.SplitRule.with_knobs(table.split_rule)
        except ValueError as e:  # a damaged table never stops the engine: the default rule, said once
            if table.source not in _REFUSED_RULES:
                _REFUSED_RULES.add(table.source)
                log.warning("error: %s: %s; running split_rule's default rule", table.source, e)
            return k.split_rule.DEFAULT_RULE

    def co_schedules(self, meta: AttentionMetadata, num_heads: int, k_cache: torch.Tensor) -> bool:
        """``hybrid="pod"``, prefills beside decodes, and the rule (set, else the device table's)
        measured that faster at the nearest shape."""
        if self.hybrid != "pod" or not (meta.num_prefills and meta.num_decodes):
            return False
        rule = self.co_schedule
        if rule is None:
            table = table_for(k_cache.device)
            rule = (CoScheduleRule.from_entries(table.co_schedule, table.source)
                    if table.co_schedule else NEVER)
        decodes = meta.seq_lens_host[meta.num_prefills:]
        return rule.co_schedules(num_heads // k_cache.shape[2], sum(meta.query_lens_host[:meta.num_prefills]),
                                 len(decodes), sum(decodes) // max(len(decodes), 1))

    def batch_plan(self, meta: AttentionMetadata, num_heads: int, k_cache: torch.Tensor):
        """Planned once from the host lengths, kept on ``meta.plan`` (a graph's: the graph's)."""
        if not isinstance(meta.plan, k.plan.AttentionPlan):
            meta.plan = self._plan_lengths(meta.query_lens_host, meta.seq_lens_host, meta.num_prefills,
                                           num_heads, k_cache)
        return meta.plan

    def warm(self, query_lens, seq_lens, num_prefills, num_heads, k_cache) -> None:
        # The same planning as batch_plan's: its balanced work lands in chunk_plan's cache.
        self._plan_lengths(query_lens, seq_lens, num_prefills, num_heads, k_cache)

    def _plan_lengths(self, query_lens, seq_lens, num_prefills, num_heads, k_cache):
        return k.plan.plan_batch(query_lens, seq_lens, num_heads, k_cache.shape[2], num_prefills=num_prefills,
                                 element_size=k_cache.element_size(), limits=self._limits(k_cache),
                                 tiles=self._tiles(k_cache), rule=self._rule(k_cache))

    def graph_plan(self, tokens: int, requests: int, num_heads: int, k_cache: torch.Tensor, *, max_seq_len: int,
                   prefill_tiles, fewest_tokens: int, fewest_decodes: int, split_counts: torch.Tensor):
        """The launches a CUDA graph captures, split counts read from ``split_counts``."""
        return k.plan.plan_graph(tokens, requests, num_heads, k_cache.shape[2], max_seq_len=max_seq_len,
                                 prefill_tiles=prefill_tiles, fewest_tokens=fewest_tokens,
                                 fewest_decodes=fewest_decodes, element_size=k_cache.element_size(),
                                 limits=self._limits(k_cache), tiles=self._tiles(k_cache), rule=self._rule(k_cache),
                                 split_counts=split_counts)

    def prefill_tile_choices(self, num_heads: int, k_cache: torch.Tensor):
        """Each prefill tile a plan may ask for, with the fewest longest-chunk tokens asking it."""
        return k.plan.prefill_tile_choices(num_heads, k_cache.shape[2], k_cache.element_size(), self._tiles(k_cache))

    @staticmethod
    def graph_split_counts(device: torch.device) -> torch.Tensor:
        return kernels().split_merge.split_counts_buffer(2, device)

    @staticmethod
    def set_split_counts(split_counts: torch.Tensor, plan, graph=None) -> None:
        """A replay's split counts (its eager ``plan``'s) into its graph's device integers, its
        balanced work into ``graph``'s buffers: one it has no work for is emptied, lest it rerun."""
        for slot, values in enumerate(plan.device_rows()):
            split_counts[slot].copy_(kernels().split_merge.plan_row(split_counts.device, values), non_blocking=True)
        pairs = ((graph.prefill, plan.prefill), (graph.decode, plan.decode)) if graph else ()
        for captured, launch in pairs:
            if captured is None or captured.balanced is None or captured.balanced.buffers is None:
                continue
            if launch is not None and launch.balanced is not None:
                captured.balanced.buffers.load(launch.balanced.work, launch.end_request)
            else:
                captured.balanced.buffers.clear()

    def rope_write_kv(self, rotary, positions, qkv, num_heads, num_kv_heads, k_cache, v_cache,
                      meta: AttentionMetadata):
        if not self.fuse_rope:
            return super().rope_write_kv(rotary, positions, qkv, num_heads, num_kv_heads, k_cache, v_cache, meta)
        # One launch for RoPE and the cache write. The softmax scale stays with attention, which folds it
        # into its exp2 argument at no cost: scaling q here would add a rounding and save nothing.
        cos, sin = rotary.tables(positions.device)
        return rope_write_kv(qkv, positions, cos, sin, k_cache, v_cache, meta.slot_mapping, num_heads,
                               num_kv_heads)

    def write_kv(self, key, value, k_cache, v_cache, meta: AttentionMetadata) -> None:
        write_kv_cache(key, value, k_cache, v_cache, meta.slot_mapping)

    def _pod_plan(self, meta: AttentionMetadata, num_heads: int, k_cache: torch.Tensor):
        """The batch's co-scheduled plan (from its host lengths) and its launch's warps."""
        return k.pod.plan_batch(meta.query_lens_host, meta.seq_lens_host, num_heads, k_cache.shape[2],
                                k_cache.shape[3], k_cache.element_size(), k_cache.device)

    def _pod(self, query: torch.Tensor, k_cache: torch.Tensor, meta: AttentionMetadata) -> PodLaunch:
        """The iteration's co-scheduled plan: made by its first layer, reused by the others."""
        if isinstance(meta.plan, PodLaunch):
            return meta.plan
        plan, warps = self._pod_plan(meta, query.shape[1], k_cache)
        work = self._work
        if work is None or work.programs != plan.programs or work.capacity < len(plan.items) \
                or work.items.device != query.device:
            # Room for any batch of this many tokens and requests: the buffers grow rarely.
            capacity = k.pod_plan.item_capacity(query.shape[0], len(meta.seq_lens_host), k_cache.shape[2], plan.tiles)
            work = self._work = k.pod.PodWork(plan.programs, capacity, query.device)
        work.load(plan)
        meta.plan = PodLaunch(plan, work, warps)
        return meta.plan

    def graph_pod(self, tokens: int, requests: int, num_heads: int, k_cache: torch.Tensor) -> PodLaunch:
        """A CUDA graph's co-scheduled launch, with buffers for any batch of up to ``tokens`` over
        ``requests`` (``load_pod`` fills them): grid and tiles are the same for every batch."""
        plan, warps = k.pod.plan_batch([], [], num_heads, k_cache.shape[2], k_cache.shape[3],
                                       k_cache.element_size(), k_cache.device)
        capacity = k.pod_plan.item_capacity(tokens, requests, k_cache.shape[2], plan.tiles)
        work = k.pod.PodWork(plan.programs, capacity, k_cache.device)
        work.load(plan)
        return PodLaunch(plan, work, warps)

    def load_pod(self, launch: PodLaunch, meta: AttentionMetadata, num_heads: int, k_cache: torch.Tensor) -> None:
        """A replay's plan, planned as its eager forward plans it, into its graph's work buffers."""
        plan, _ = self._pod_plan(meta, num_heads, k_cache)
        launch.work.load(plan)

    def attend(self, query, k_cache, v_cache, meta: AttentionMetadata, scale: float):
        # Only a batch with both kinds has anything to overlap. A forward being captured runs what its
        # graph planned (its lengths are placeholders): a co-scheduled graph's launch, or planned kernels.
        if isinstance(meta.plan, PodLaunch) or (meta.plan is None and not _capturing(query.device)
                                                and self.co_schedules(meta, query.shape[1], k_cache)):
            launch = self._pod(query, k_cache, meta)
            return pod_attention(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                                 launch.plan, launch.work, scale, num_warps=launch.num_warps)
        plan = self.batch_plan(meta, query.shape[1], k_cache)
        return paged_attention(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                               scale, plan=plan)


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()
