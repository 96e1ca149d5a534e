"""CUDA graphs of cut batches: a cut per mixed bucket, a graph per pair of prefill tiles."""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from sarathi_lab.attention import AttentionMetadata
from sarathi_lab.model.nano_batch import NanoBatch, OverlapRule

if TYPE_CHECKING:
    from sarathi_lab.model.runner import PreparedBatch


class Graph(NamedTuple):
    """The key of a captured forward in cuda_graphs.py's table, whole or cut."""
    decode: bool
    tokens: int
    requests: int
    prefill_tiles: object = None  # a cut graph's: its two nano-batches'
    pod: bool = False
    cut: int = 0  # the first nano-batch's tokens; 0: the batch runs whole


def bucket_cut(rule: OverlapRule, bucket: int) -> int | None:
    """The cut of a batch filling ``bucket``: buckets past a GEMM tile end at its multiples, so each
    batch of one is cut at one token, unless its prefill ends before (then eager)."""
    return rule.cut(bucket, bucket, 1)


def part_sizes(graph: Graph, max_batch: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(tokens, requests) of ``graph``'s nano-batches: the cut's tokens (prefill), then the rest."""
    rest = graph.tokens - graph.cut
    return (graph.cut, min(max_batch, graph.cut)), (rest, min(max_batch, rest))


class PartBuffers:
    """A batch's or a nano-batch's metadata as its graphs read it."""

    def __init__(self, requests: int, max_blocks: int, split_counts: torch.Tensor):
        dev, i32 = split_counts.device, torch.int32
        self.query_start_loc = torch.zeros(requests + 1, dtype=i32, device=dev)
        self.seq_lens = torch.zeros(requests, dtype=i32, device=dev)
        self.block_tables = torch.zeros(requests, max_blocks, dtype=i32, device=dev)
        self.split_counts = split_counts

    def meta(self, slots: torch.Tensor, requests: int, plan,
             decode_starts: torch.Tensor | None = None) -> AttentionMetadata:
        """What a graph captures: host values fixed, none read by its launches; decodes' query
        starts are ``decode_starts``, fixed too."""
        n, decode = slots.shape[0], decode_starts is not None
        starts = decode_starts if decode else self.query_start_loc
        return AttentionMetadata(
            num_prefills=0 if decode else requests, num_decodes=requests if decode else 0,
            num_prefill_tokens=0 if decode else n, query_start_loc=starts[: requests + 1],
            seq_lens=self.seq_lens[:requests], block_tables=self.block_tables[:requests],
            slot_mapping=slots, query_lens_host=[int(decode)] * requests,
            seq_lens_host=[0] * requests, max_query_len=1 if decode else n, plan=plan)

    def padded(self, tokens: slice, requests: int, positions: torch.Tensor, slots: torch.Tensor,
               plan) -> NanoBatch:
        """A nano-batch's positions and slots view the whole batch's."""
        return NanoBatch(tokens, positions[tokens], self.meta(slots[tokens], requests, plan))

    def load(self, meta: AttentionMetadata, requests: int, decode: bool = False) -> None:
        """``meta``'s values; the graph's padded requests read no cache and hold no query."""
        n, width = meta.num_prefills + meta.num_decodes, meta.block_tables.shape[1]
        if not decode:
            self.query_start_loc[: n + 1].copy_(meta.query_start_loc, non_blocking=True)
            self.query_start_loc[n + 1 : requests + 1].fill_(sum(meta.query_lens_host))
        self.seq_lens[:n].copy_(meta.seq_lens, non_blocking=True)
        self.seq_lens[n:requests].fill_(0)
        # Entries past a request's context are never read: the rest of its row may stay stale.
        self.block_tables[:n, :width].copy_(meta.block_tables, non_blocking=True)


class NanoGraphs:
    """The cut graphs of ``owner`` (a CudaGraphs, sharing buffers); none unless ``rule`` cuts."""

    def __init__(self, owner, rule: OverlapRule, max_batch: int, max_blocks: int):
        self.owner, self.max_batch = owner, max_batch
        self.graphs = []
        for bucket in owner.buckets:
            at = bucket_cut(rule, bucket)
            if at is None:
                continue
            fewest = owner._fewest(owner.buckets, bucket)
            cut = Graph(False, bucket, min(max_batch, bucket), cut=at)
            (t1, r1), (t2, r2) = part_sizes(cut, max_batch)
            self.graphs += [cut._replace(prefill_tiles=(first, second))
                            for first in owner._prefill_tiles(t1, r1, t1)
                            for second in owner._prefill_tiles(t2, r2, max(1, fewest - at))]
        split_counts = owner.backend.graph_split_counts
        dev = owner.positions.device
        self.parts = tuple(PartBuffers(max_batch, max_blocks, split_counts(dev)) for _ in range(2))

    def plans(self, graph: Graph, max_seq_len: int) -> tuple:
        """Each nano-batch's launches, reading split counts from its own buffer."""
        owner = self.owner
        fewest = owner._fewest(owner.buckets, graph.tokens)
        plans = []
        for (tokens, requests), tiles, least, part in zip(
                part_sizes(graph, self.max_batch), graph.prefill_tiles,
                (graph.cut, max(1, fewest - graph.cut)), self.parts):
            plans.append(owner.backend.graph_plan(
                tokens, requests, owner.num_heads, owner.k_cache, max_seq_len=max_seq_len,
                prefill_tiles=tiles, fewest_tokens=least, fewest_decodes=1,
                split_counts=part.split_counts))
        return tuple(plans)

    def padded(self, graph: Graph) -> tuple[NanoBatch, NanoBatch]:
        owner = self.owner
        slices = (slice(0, graph.cut), slice(graph.cut, graph.tokens))
        return tuple(part.padded(tokens, requests, owner.positions, owner.slots, plan)
                     for part, tokens, (_, requests), plan in zip(
                         self.parts, slices, part_sizes(graph, self.max_batch),
                         owner.plans[graph]))

    def graph_for(self, prepared: PreparedBatch) -> Graph | None:
        """The smallest cut graph fitting both nano-batches; None (eager) where one co-schedules."""
        owner, parts = self.owner, prepared.nano
        backend, heads, k_cache = owner.backend, owner.num_heads, owner.k_cache
        if any(backend.co_schedules(p.meta, heads, k_cache) for p in parts):
            return None
        meta, at = prepared.meta, parts[0].tokens.stop
        tokens, requests = prepared.input_ids.shape[0], meta.num_prefills + meta.num_decodes
        counts = [p.meta.num_prefills + p.meta.num_decodes for p in parts]
        held = [g for g in self.graphs if g.tokens >= tokens and g.requests >= requests
                and g.cut == at
                and all(n <= r for n, (_, r) in zip(counts, part_sizes(g, self.max_batch)))]
        if not held:
            return None
        plans = [backend.batch_plan(p.meta, heads, k_cache) for p in parts]
        return next((g for g in held
                     if all(p.replays_in(c) for p, c in zip(plans, owner.plans[g]))), None)

    def load(self, prepared: PreparedBatch, graph: Graph) -> None:
        """The batch's nano-batches' metadata, split counts and balanced work into the graph's."""
        backend, heads, k_cache = self.owner.backend, self.owner.num_heads, self.owner.k_cache
        for part, nano, (_, requests), captured in zip(
                self.parts, prepared.nano, part_sizes(graph, self.max_batch),
                self.owner.plans[graph]):
            part.load(nano.meta, requests)
            plan = backend.batch_plan(nano.meta, heads, k_cache)
            backend.set_split_counts(part.split_counts, plan, captured)
