"""CUDA graphs of decode and mixed forwards (whole, or cut: nano_graphs.py), each batch copied into
persistent buffers (as vLLM v1); only a backend reading per-batch values from the device replays."""
from __future__ import annotations

import time
from collections.abc import Callable

import torch

from sarathi_lab.attention import AttentionBackend, backend_class, backend_names
from sarathi_lab.engine.tiles import GEMM_TILE
from sarathi_lab.model.nano_graphs import Graph, NanoGraphs, PartBuffers
from sarathi_lab.model.runner import ModelRunner, PreparedBatch

Capture = Callable[[Callable[[], torch.Tensor], object],
                   tuple[Callable[[], None], torch.Tensor, object]]
# Eager forwards first (as PyTorch asks): kernels compiled, workspaces taken outside it.
WARMUP_FORWARDS = 2

# Mixed buckets: powers of two up to the GEMM tile, then every tile multiple (GEMMs run whole row
# tiles: a bucket between multiples saves nothing and costs a capture).
SMALLEST_BUCKET = 16
# Past this, an iteration's GPU work outlasts the host's launches: a graph would save nothing.
MAX_GRAPH_TOKENS = 1024


def can_replay(backend: AttentionBackend, device: torch.device) -> bool:
    return backend.replayable and device.type == "cuda"


def capture_cuda_graph(forward: Callable[[], torch.Tensor], pool=None):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_FORWARDS):
            forward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = forward()
    return graph.replay, out, graph.pool()


def graph_sizes(max_batch: int) -> list[int]:
    return sorted({b for b in (1, 2, 4, 8) if b < max_batch} | set(range(16, max_batch, 16))
                  | {max_batch})


def bucket_step(tokens: int) -> int:
    return min(GEMM_TILE, tokens)


def token_buckets(largest: int) -> list[int]:
    largest = min(largest, MAX_GRAPH_TOKENS)
    unit = GEMM_TILE if largest > GEMM_TILE else SMALLEST_BUCKET
    top = -(-largest // unit) * unit
    buckets, tokens = [], SMALLEST_BUCKET
    while tokens < top:
        buckets.append(tokens)
        tokens += bucket_step(tokens)
    return buckets + [top]


class CudaGraphs:
    """``capture``: a CUDA graph (tests pass a CPU stand-in); ``pool``: another set's memory pool,
    shared (an engine replays one graph at a time, whichever set it is of)."""

    def __init__(self, runner: ModelRunner, max_batch: int, max_blocks: int,
                 mixed_tokens: int | None = None, capture: Capture = capture_cuda_graph,
                 pool=None):
        backend = runner.model.backend
        if not backend.replayable:
            allowed = [name for name in backend_names()
                       if backend_class(name, runner.device).replayable]
            raise ValueError(f"attention={backend.name!r} plans each batch from host values: its "
                             f"forwards cannot be replayed; allowed: {', '.join(allowed)}")
        self.sizes = graph_sizes(max_batch)
        self.buckets = token_buckets(mixed_tokens) if mixed_tokens else []
        tokens = max(max_batch, *self.buckets) if self.buckets else max_batch
        dev, i32, i64 = runner.device, torch.int32, torch.int64
        self.input_ids = torch.zeros(tokens, dtype=i64, device=dev)
        self.positions = torch.zeros(tokens, dtype=i64, device=dev)
        self.slots = torch.full((tokens,), -1, dtype=i64, device=dev)
        # Each replay's split counts and request ranges, copied here for the captured launches.
        self.whole = PartBuffers(max_batch, max_blocks, backend.graph_split_counts(dev))
        self.block_tables, self.split_counts = self.whole.block_tables, self.whole.split_counts
        # Decode graphs' query starts and sampled rows never change; mixed graphs' are copied in.
        self.decode_starts = torch.arange(max_batch + 1, dtype=i32, device=dev)
        self.decode_rows = torch.arange(max_batch, dtype=i64, device=dev)
        self.sampled_rows = torch.zeros(max_batch, dtype=i64, device=dev)
        self.backend, self.num_heads = backend, runner.model.config.num_attention_heads
        self.k_cache = runner.kv_caches[0][0]
        self.decode_graphs = {size: Graph(True, size, size) for size in self.sizes}
        self.mixed_graphs = [
            Graph(False, b, min(max_batch, b), tiles) for b in self.buckets
            for tiles in self._prefill_tiles(b, min(max_batch, b), self._fewest(self.buckets, b))]
        pod = getattr(backend, "hybrid", "sequential") == "pod"
        self.pod_graphs = ([Graph(False, b, min(max_batch, b), pod=True) for b in self.buckets]
                           if pod else [])
        self.nano = NanoGraphs(self, runner.overlap, max_batch, max_blocks)
        max_seq_len = max_blocks * self.k_cache.shape[1]
        every = [*self.decode_graphs.values(), *self.mixed_graphs, *self.pod_graphs,
                 *self.nano.graphs]
        self.plans = {graph: self._attention_plan(graph, max_seq_len) for graph in every}
        self.pool = pool
        self.record = self._capture(runner, every, capture)

    def _capture(self, runner: ModelRunner, every: list[Graph], capture: Capture) -> dict:
        """Every graph captured; what was captured, for the run's record."""
        self.graphs: dict[Graph, tuple[Callable[[], None], torch.Tensor]] = {}
        dev = runner.device
        cuda = dev.type == "cuda"
        reserved_before = torch.cuda.memory_reserved(dev) if cuda else None
        start, pool = time.perf_counter(), self.pool
        # Largest first: every smaller graph fits the pool memory the largest took.
        for graph in sorted(every, key=lambda g: (g.tokens, not g.decode), reverse=True):
            prepared = self._padded(graph)
            replay, out, pool = capture(lambda prepared=prepared: runner.forward(prepared), pool)
            self.graphs[graph] = (replay, out)
        self.pool = pool
        if cuda:
            torch.cuda.synchronize(dev)
        return {
            "decode_sizes": self.sizes, "mixed_tokens": self.buckets,
            "mixed_requests": self.block_tables.shape[0],
            "graphs": len(self.graphs),
            "mixed_tiles": [[g.tokens, g.prefill_tiles.block_m, g.prefill_tiles.num_warps]
                            for g in self.mixed_graphs],
            "pod_graphs": len(self.pod_graphs),
            "nano_graphs": [[g.tokens, g.cut] for g in self.nano.graphs],
            "capture_s": round(time.perf_counter() - start, 3),
            "pool_bytes": pool_bytes(pool) if cuda else None,
            "reserved_before_bytes": reserved_before,
            "reserved_after_bytes": torch.cuda.memory_reserved(dev) if cuda else None}

    @staticmethod
    def _fewest(sizes: list[int], size: int) -> int:
        below = [s for s in sizes if s < size]
        return below[-1] + 1 if below else 1

    def _prefill_tiles(self, tokens: int, requests: int, fewest: int) -> list:
        choices = self.backend.prefill_tile_choices(self.num_heads, self.k_cache)
        kept = []
        for i, (tiles, longest_from) in enumerate(choices):
            longest_below = choices[i + 1][1] if i + 1 < len(choices) else tokens + 1
            # Its longest chunk reaches longest_from; chunks below the next tile's hold fewest.
            if longest_from <= tokens and requests * (longest_below - 1) >= fewest:
                kept.append(tiles)
        return kept

    def _attention_plan(self, graph: Graph, max_seq_len: int):
        if graph.cut:
            return self.nano.plans(graph, max_seq_len)
        if graph.pod:
            return self.backend.graph_pod(graph.tokens, graph.requests, self.num_heads,
                                          self.k_cache)
        fewest = self._fewest(self.sizes if graph.decode else self.buckets, graph.tokens)
        return self.backend.graph_plan(
            graph.tokens, graph.requests, self.num_heads, self.k_cache, max_seq_len=max_seq_len,
            prefill_tiles=graph.prefill_tiles, fewest_tokens=fewest,
            fewest_decodes=fewest if graph.decode else 1, split_counts=self.split_counts)

    def _padded(self, graph: Graph) -> PreparedBatch:
        t, r = graph.tokens, graph.requests
        meta = self.whole.meta(self.slots[:t], r, None if graph.cut else self.plans[graph],
                               self.decode_starts if graph.decode else None)
        rows = self.decode_rows[:r] if graph.decode else self.sampled_rows[:r]
        nano = self.nano.padded(graph) if graph.cut else None
        return PreparedBatch(self.input_ids[:t], self.positions[:t], meta, rows, nano)

    def graph_for(self, prepared: PreparedBatch) -> Graph | None:
        """The smallest graph running this batch's attention as its eager forward would."""
        meta = prepared.meta
        if meta.block_tables.shape[1] > self.block_tables.shape[1]:
            return None
        if prepared.nano is not None:
            return self.nano.graph_for(prepared)
        requests, tokens = meta.num_prefills + meta.num_decodes, prepared.input_ids.shape[0]
        if self.pod_graphs and self.backend.co_schedules(meta, self.num_heads, self.k_cache):
            return next((g for g in self.pod_graphs
                         if g.tokens >= tokens and g.requests >= requests), None)
        graphs = self.mixed_graphs if meta.num_prefills else self.decode_graphs.values()
        held = [g for g in graphs if g.tokens >= tokens and g.requests >= requests]
        if not held:
            return None
        plan = self.backend.batch_plan(meta, self.num_heads, self.k_cache)
        return next((g for g in held if plan.replays_in(self.plans[g])), None)

    def replayed_plan(self, graph: Graph):
        return self.plans[graph].with_split_counts(self.split_counts[:, 0].tolist())

    def replay(self, prepared: PreparedBatch, graph: Graph) -> torch.Tensor:
        sampled = prepared.logits_indices.shape[0]
        self._load_tokens(prepared, graph)
        if graph.cut:
            self.nano.load(prepared, graph)
        else:
            self._load_meta(prepared, graph)
        replay, out = self.graphs[graph]
        replay()
        return out[:sampled]

    def _load_tokens(self, prepared: PreparedBatch, graph: Graph) -> None:
        t, sampled = prepared.input_ids.shape[0], prepared.logits_indices.shape[0]
        self.input_ids[:t].copy_(prepared.input_ids, non_blocking=True)
        self.positions[:t].copy_(prepared.positions, non_blocking=True)
        self.slots[:t].copy_(prepared.meta.slot_mapping, non_blocking=True)
        # Padded tokens write no key (slot -1); their stale ids and positions are never sampled.
        if t < graph.tokens:
            self.slots[t : graph.tokens].fill_(-1)
        if not graph.decode:
            self.sampled_rows[:sampled].copy_(prepared.logits_indices, non_blocking=True)
            # Row 0 lies inside every bucket; a stale row may lie past a smaller one.
            if sampled < graph.requests:
                self.sampled_rows[sampled : graph.requests].fill_(0)

    def _load_meta(self, prepared: PreparedBatch, graph: Graph) -> None:
        meta = prepared.meta
        self.whole.load(meta, graph.requests, graph.decode)
        if graph.pod:
            self.backend.load_pod(self.plans[graph], meta, self.num_heads, self.k_cache)
        else:
            plan = self.backend.batch_plan(meta, self.num_heads, self.k_cache)
            self.backend.set_split_counts(self.split_counts, plan, self.plans[graph])


def pool_bytes(pool) -> int | None:
    try:
        segments = torch.cuda.memory_snapshot(include_traces=False)
        return sum(s["total_size"] for s in segments if tuple(s["segment_pool_id"]) == tuple(pool))
    except (KeyError, TypeError, RuntimeError):
        return None
