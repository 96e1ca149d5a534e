"""CUDA graphs of the engine's forwards, as vLLM v1 captures full graphs: each captured once when the
engine is built over persistent input and attention-metadata buffers, and replayed by every batch it
holds with that batch's inputs copied into those buffers. Two kinds, sharing the buffers and one
memory pool (captured largest first, so the smaller reuse the largest's memory):
- decode-only forwards at a few batch sizes, as vLLM and nano-vllm capture decode;
- mixed forwards (prefill chunks, alone or beside decodes: SARATHI's hybrid iteration, and whole
  prompts) at a few padded token counts ("buckets"), each with a fixed padded request count.
On a GPU an eager forward waits on the host launching its kernels one by one (the GPU suite's
``launch`` step measures both).

What a captured forward reads from the host is fixed when it is captured, so only a forward that
reads every per-batch value from device tensors can be replayed: the Triton attention backend's.
Its launches (attention_plan.py) are captured at their largest: a decode launch over every request,
and in a mixed graph a prefill launch on one kind of prefill tile, each with room for as many KV-walk
splits as any batch the graph holds can be given. A replayed batch's attention is planned on the host
exactly as its eager forward would be; the graph chosen has that plan's tiles and room for its splits,
and the plan's split counts and request ranges are copied into device integers the launches read. So a replay
splits as the eager forward does. Where a plan may take taller prefill tiles, a bucket holds one mixed
graph a tile kind its batches may ask for. With prefill and decode work co-scheduled
(``attention_hybrid=pod``), a bucket also holds a graph of the one persistent launch, which the batches
with both kinds replay, as their eager forwards run it: each replay's plan (the work lists of every
SM's lanes) is planned on the host and copied into that graph's work buffers.

A batch smaller than its graph is padded: the extra tokens' KV slots are -1 (the KV write skips
them); a padded decode has context 0 and a padded request of a mixed graph query length 0 and
context 0, so neither reads the cache; their outputs are dropped, and the sampled rows' logits are
gathered through a persistent index buffer."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from sarathi_lab.attention import AttentionBackend, AttentionMetadata, backend_class, backend_names
from sarathi_lab.engine.tiles import GEMM_TILE
from sarathi_lab.model.runner import ModelRunner, PreparedBatch

# capture(forward, pool) -> (replay, the output tensor replay refills, the memory pool to share).
Capture = Callable[[Callable[[], torch.Tensor], object], tuple[Callable[[], None], torch.Tensor, object]]
# Eager forwards run before a capture, as PyTorch's documentation asks: kernels compiled, cuBLAS's
# workspace and the allocator's blocks taken outside the graph.
WARMUP_FORWARDS = 2

# Mixed graphs' token counts: multiples of the smallest (a tensor core's smallest row tile), powers
# of two up to the GEMM tile (engine/tiles.py), then every multiple of it. The projections' GEMMs run
# in whole tiles of rows: a batch one token past a tile pays for the next whole tile, whatever bucket
# holds it, so buckets between tile multiples save the GEMMs nothing (only the elementwise kernels'
# padded rows) while each costs a capture; padding never crosses a tile boundary, and the chunking
# schedulers' tile-aligned batches (scheduler.chunk_align) fill their bucket exactly.
SMALLEST_BUCKET = 16
# The most tokens a mixed graph holds: a larger iteration's GPU work outlasts the host's launches, and
# each bucket more is a capture at start-up.
MAX_GRAPH_TOKENS = 1024


def can_replay(backend: AttentionBackend, device: torch.device) -> bool:
    """Whether forwards over ``backend`` on ``device`` can be captured and replayed."""
    return backend.replayable and device.type == "cuda"


def capture_cuda_graph(forward: Callable[[], torch.Tensor], pool=None):
    """``forward`` captured in a CUDA graph after warm-up forwards on a side stream; graphs given the
    same ``pool`` share their memory (captured largest first, the smaller reuse the largest's)."""
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
    """The decode batch sizes captured, ascending: 1, 2, 4, 8, then every 16th, and ``max_batch``."""
    return sorted({b for b in (1, 2, 4, 8) if b < max_batch} | set(range(16, max_batch, 16)) | {max_batch})


def bucket_step(tokens: int) -> int:
    """How far the next mixed bucket lies above a bucket of ``tokens``: doubling below the GEMM tile,
    a tile at a time from it."""
    return min(GEMM_TILE, tokens)


def token_buckets(largest: int) -> list[int]:
    """The mixed graphs' token counts, ascending, up to ``largest`` (the most tokens an iteration holds,
    at most MAX_GRAPH_TOKENS) rounded up to SMALLEST_BUCKET, or from a GEMM tile up to a whole tile."""
    largest = min(largest, MAX_GRAPH_TOKENS)
    unit = GEMM_TILE if largest > GEMM_TILE else SMALLEST_BUCKET
    top = -(-largest // unit) * unit
    buckets, tokens = [], SMALLEST_BUCKET
    while tokens < top:
        buckets.append(tokens)
        tokens += bucket_step(tokens)
    return buckets + [top]


class Graph(NamedTuple):
    """One captured forward: a decode-only one of ``tokens`` requests, or a mixed one of ``tokens``
    tokens over ``requests`` requests, whose attention runs prefill work on ``prefill_tiles`` (an
    attention_plan.TileConfig; None in a decode graph), or, ``pod``, prefill and decode work in one
    co-scheduled launch."""
    decode: bool
    tokens: int
    requests: int
    prefill_tiles: object = None
    pod: bool = False


class CudaGraphs:
    """The decode-only forwards of up to ``max_batch`` requests and, with ``mixed_tokens``, the mixed
    forwards of up to that many tokens (token_buckets) and ``max_batch`` requests, whose block tables
    are at most ``max_blocks`` wide, captured by ``capture`` (a CUDA graph; tests pass a stand-in on
    the CPU). ``record``: what was captured, how long it took and the memory it holds."""

    def __init__(self, runner: ModelRunner, max_batch: int, max_blocks: int, mixed_tokens: int | None = None,
                 capture: Capture = capture_cuda_graph):
        backend = runner.model.backend
        if not backend.replayable:
            allowed = [name for name in backend_names() if backend_class(name, runner.device).replayable]
            raise ValueError(f"attention={backend.name!r} plans each batch from host values: its forwards cannot "
                             f"be replayed; allowed: {', '.join(allowed)}")
        self.sizes = graph_sizes(max_batch)
        self.buckets = token_buckets(mixed_tokens) if mixed_tokens else []
        tokens = max(max_batch, *self.buckets) if self.buckets else max_batch
        dev, i32, i64 = runner.device, torch.int32, torch.int64
        self.input_ids = torch.zeros(tokens, dtype=i64, device=dev)
        self.positions = torch.zeros(tokens, dtype=i64, device=dev)
        self.slots = torch.full((tokens,), -1, dtype=i64, device=dev)
        self.seq_lens = torch.zeros(max_batch, dtype=i32, device=dev)
        self.block_tables = torch.zeros(max_batch, max_blocks, dtype=i32, device=dev)
        # A decode graph's query starts and sampled rows never change (one token per request); a mixed
        # graph's are copied in per batch.
        self.decode_starts = torch.arange(max_batch + 1, dtype=i32, device=dev)
        self.decode_rows = torch.arange(max_batch, dtype=i64, device=dev)
        self.query_start_loc = torch.zeros(max_batch + 1, dtype=i32, device=dev)
        self.sampled_rows = torch.zeros(max_batch, dtype=i64, device=dev)
        self.backend, self.num_heads = backend, runner.model.config.num_attention_heads
        self.k_cache = runner.kv_caches[0][0]
        # The device integers each replay's split counts and request ranges are copied into (read by the
        # captured launches).
        self.split_counts = backend.graph_split_counts(dev)
        self.decode_graphs = {size: Graph(True, size, size) for size in self.sizes}
        self.mixed_graphs = [Graph(False, b, min(max_batch, b), tiles) for b in self.buckets
                             for tiles in self._prefill_tiles(b, min(max_batch, b), self._fewest(self.buckets, b))]
        pod = getattr(backend, "hybrid", "sequential") == "pod"
        self.pod_graphs = [Graph(False, b, min(max_batch, b), pod=True) for b in self.buckets] if pod else []
        max_seq_len = max_blocks * self.k_cache.shape[1]
        every = [*self.decode_graphs.values(), *self.mixed_graphs, *self.pod_graphs]
        self.plans = {graph: self._attention_plan(graph, max_seq_len) for graph in every}
        self.graphs: dict[Graph, tuple[Callable[[], None], torch.Tensor]] = {}
        cuda = dev.type == "cuda"
        reserved_before = torch.cuda.memory_reserved(dev) if cuda else None
        start, pool = time.perf_counter(), None
        # Largest first, so that every smaller graph fits the memory the largest took in the pool.
        for graph in sorted(every, key=lambda g: (g.tokens, not g.decode), reverse=True):
            prepared = self._padded(graph)
            replay, out, pool = capture(lambda prepared=prepared: runner.forward(prepared), pool)
            self.graphs[graph] = (replay, out)
        if cuda:
            torch.cuda.synchronize(dev)
        self.record = {
            "decode_sizes": self.sizes, "mixed_tokens": self.buckets, "mixed_requests": max_batch,
            "graphs": len(self.graphs),
            "mixed_tiles": [[g.tokens, g.prefill_tiles.block_m, g.prefill_tiles.num_warps] for g in self.mixed_graphs],
            "pod_graphs": len(self.pod_graphs),
            "capture_s": round(time.perf_counter() - start, 3),
            "pool_bytes": pool_bytes(pool) if cuda else None,
            "reserved_before_bytes": reserved_before,
            "reserved_after_bytes": torch.cuda.memory_reserved(dev) if cuda else None}

    @staticmethod
    def _fewest(sizes: list[int], size: int) -> int:
        """The fewest tokens (requests, in a decode graph) of a batch whose smallest graph is ``size``."""
        below = [s for s in sizes if s < size]
        return below[-1] + 1 if below else 1

    def _prefill_tiles(self, tokens: int, requests: int, fewest: int) -> list:
        """The prefill tiles a batch of ``fewest`` to ``tokens`` tokens in at most ``requests`` requests
        may ask for: those whose range of longest chunks it can have."""
        choices = self.backend.prefill_tile_choices(self.num_heads, self.k_cache)
        kept = []
        for i, (tiles, longest_from) in enumerate(choices):
            longest_below = choices[i + 1][1] if i + 1 < len(choices) else tokens + 1
            # Its longest chunk can reach longest_from, and requests chunks each shorter than the next
            # tile's can hold the fewest tokens.
            if longest_from <= tokens and requests * (longest_below - 1) >= fewest:
                kept.append(tiles)
        return kept

    def _attention_plan(self, graph: Graph, max_seq_len: int):
        if graph.pod:
            return self.backend.graph_pod(graph.tokens, graph.requests, self.num_heads, self.k_cache)
        fewest = self._fewest(self.sizes if graph.decode else self.buckets, graph.tokens)
        return self.backend.graph_plan(graph.tokens, graph.requests, self.num_heads, self.k_cache,
                                       max_seq_len=max_seq_len, prefill_tiles=graph.prefill_tiles,
                                       fewest_tokens=fewest, fewest_decodes=fewest if graph.decode else 1,
                                       split_counts=self.split_counts)

    def _padded(self, graph: Graph) -> PreparedBatch:
        """The buffers' first rows as the batch ``graph`` captures. Its host values are what capture
        fixes: the attention plan (the graph's launches, reading the device integers each replay
        refills) is the one a forward reads; the counts and host lists describe the padded batch for
        whoever inspects it."""
        t, r = graph.tokens, graph.requests
        if graph.decode:
            starts, rows, query_lens, hint = self.decode_starts[: r + 1], self.decode_rows[:r], [1] * r, 1
        else:
            starts, rows, query_lens, hint = self.query_start_loc[: r + 1], self.sampled_rows[:r], [0] * r, t
        meta = AttentionMetadata(
            num_prefills=0 if graph.decode else r, num_decodes=r if graph.decode else 0,
            num_prefill_tokens=0 if graph.decode else t, query_start_loc=starts, seq_lens=self.seq_lens[:r],
            block_tables=self.block_tables[:r], slot_mapping=self.slots[:t], query_lens_host=query_lens,
            seq_lens_host=[0] * r, max_query_len=hint, plan=self.plans[graph])
        return PreparedBatch(self.input_ids[:t], self.positions[:t], meta, rows)

    def graph_for(self, prepared: PreparedBatch) -> Graph | None:
        """The smallest captured graph that holds this batch and runs its attention as its eager forward
        would (its plan's tiles, room for its splits); None: it runs eagerly (more requests or tokens
        than captured, a table wider than captured, or a batch with prefills and no mixed graphs)."""
        meta = prepared.meta
        # Each graph holds a whole batch's forward: nano-batches run eagerly.
        if meta.block_tables.shape[1] > self.block_tables.shape[1] or prepared.nano is not None:
            return None
        requests, tokens = meta.num_prefills + meta.num_decodes, prepared.input_ids.shape[0]
        # What its eager forward co-schedules replays the co-scheduled launch.
        if self.pod_graphs and self.backend.co_schedules(meta, self.num_heads, self.k_cache):
            return next((g for g in self.pod_graphs if g.tokens >= tokens and g.requests >= requests), None)
        graphs = self.mixed_graphs if meta.num_prefills else self.decode_graphs.values()
        held = [g for g in graphs if g.tokens >= tokens and g.requests >= requests]
        if not held:
            return None
        plan = self.backend.batch_plan(meta, self.num_heads, self.k_cache)
        return next((g for g in held if plan.replays_in(self.plans[g])), None)

    def replayed_plan(self, graph: Graph):
        """The attention launches ``graph``'s last replay ran: its captured tiles with the split counts
        it was given (reads the device: for tests and inspection)."""
        return self.plans[graph].with_split_counts(self.split_counts[:, 0].tolist())

    def replay(self, prepared: PreparedBatch, graph: Graph) -> torch.Tensor:
        """The logits of ``prepared``'s sampled rows from ``graph`` (a view its next replay overwrites)."""
        meta = prepared.meta
        t, n, width = prepared.input_ids.shape[0], meta.num_prefills + meta.num_decodes, meta.block_tables.shape[1]
        sampled = prepared.logits_indices.shape[0]
        self.input_ids[:t].copy_(prepared.input_ids, non_blocking=True)
        self.positions[:t].copy_(prepared.positions, non_blocking=True)
        self.slots[:t].copy_(meta.slot_mapping, non_blocking=True)
        self.seq_lens[:n].copy_(meta.seq_lens, non_blocking=True)
        # Entries past a request's context are never read, so the rest of its row may stay stale.
        self.block_tables[:n, :width].copy_(meta.block_tables, non_blocking=True)
        # Padded tokens write no key (slot -1); padded requests read no cache (context 0). Their inputs
        # (ids, positions) stay those of an earlier batch: valid, and their rows are never sampled.
        if t < graph.tokens:
            self.slots[t : graph.tokens].fill_(-1)
        if n < graph.requests:
            self.seq_lens[n : graph.requests].fill_(0)
        if not graph.decode:
            self.query_start_loc[: n + 1].copy_(meta.query_start_loc, non_blocking=True)
            if n < graph.requests:  # query length 0: every padded request starts where the real tokens end
                self.query_start_loc[n + 1 : graph.requests + 1].fill_(t)
            self.sampled_rows[:sampled].copy_(prepared.logits_indices, non_blocking=True)
            if sampled < graph.requests:  # a row inside every bucket; a stale one may lie past a smaller one
                self.sampled_rows[sampled : graph.requests].fill_(0)
        if graph.pod:
            self.backend.load_pod(self.plans[graph], meta, self.num_heads, self.k_cache)
        else:
            plan = self.backend.batch_plan(meta, self.num_heads, self.k_cache)
            self.backend.set_split_counts(self.split_counts, plan, self.plans[graph])
        replay, out = self.graphs[graph]
        replay()
        return out[:sampled]


def pool_bytes(pool) -> int | None:
    """The bytes the CUDA caching allocator holds for the graph memory pool ``pool``; None where this
    torch's allocator snapshot does not say (the record keeps memory_reserved beside it)."""
    try:
        segments = torch.cuda.memory_snapshot(include_traces=False)
        return sum(s["total_size"] for s in segments if tuple(s["segment_pool_id"]) == tuple(pool))
    except (KeyError, TypeError, RuntimeError):
        return None
