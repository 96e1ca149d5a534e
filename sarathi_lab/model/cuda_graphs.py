"""CUDA graphs of decode-only forwards, as vLLM and nano-vllm capture them: one graph per batch size of
a few sizes, captured once when the engine is built, each replayed by the decode-only batches it
holds with their inputs copied into the buffers it was captured on. On a GPU an eager decode forward
waits on the host launching its kernels one by one (the GPU suite's ``launch`` step measures both).

What a captured forward reads from the host is fixed when it is captured, so only a forward that
reads every per-batch value from device tensors can be replayed: the Triton attention backend's.
A batch smaller than its graph is padded: the extra rows' KV slots are -1 (the KV write skips them)
and their contexts 0, so they read no cache; their outputs are dropped."""
from __future__ import annotations

from collections.abc import Callable

import torch

from sarathi_lab.attention import AttentionMetadata
from sarathi_lab.model.runner import ModelRunner, PreparedBatch

# capture(forward, pool) -> (replay, the output tensor replay refills, the memory pool to share).
Capture = Callable[[Callable[[], torch.Tensor], object], tuple[Callable[[], None], torch.Tensor, object]]
# Eager forwards run before a capture, as PyTorch's documentation asks: kernels compiled, cuBLAS's
# workspace and the allocator's blocks taken outside the graph.
WARMUP_FORWARDS = 2


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


class DecodeGraphs:
    """The decode-only forwards of up to ``max_batch`` requests whose block tables are at most
    ``max_blocks`` wide, captured by ``capture`` (a CUDA graph; tests pass a stand-in on the CPU)."""

    def __init__(self, runner: ModelRunner, max_batch: int, max_blocks: int, capture: Capture = capture_cuda_graph):
        dev, i32, i64 = runner.device, torch.int32, torch.int64
        self.input_ids = torch.zeros(max_batch, dtype=i64, device=dev)
        self.positions = torch.zeros(max_batch, dtype=i64, device=dev)
        self.slots = torch.full((max_batch,), -1, dtype=i64, device=dev)
        self.seq_lens = torch.zeros(max_batch, dtype=i32, device=dev)
        self.block_tables = torch.zeros(max_batch, max_blocks, dtype=i32, device=dev)
        self.query_start_loc = torch.arange(max_batch + 1, dtype=i32, device=dev)  # one token per request
        self.rows = torch.arange(max_batch, dtype=i64, device=dev)
        self.sizes = graph_sizes(max_batch)
        self.graphs: dict[int, tuple[Callable[[], None], torch.Tensor]] = {}
        pool = None
        for size in reversed(self.sizes):
            prepared = self._padded(size)
            replay, out, pool = capture(lambda prepared=prepared: runner.forward(prepared), pool)
            self.graphs[size] = (replay, out)

    def _padded(self, size: int) -> PreparedBatch:
        """The first ``size`` rows of the buffers as a decode batch (host lists: what capture fixes)."""
        meta = AttentionMetadata(
            num_prefills=0, num_decodes=size, num_prefill_tokens=0, query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size], block_tables=self.block_tables[:size], slot_mapping=self.slots[:size],
            query_lens_host=[1] * size, seq_lens_host=[1] * size, max_query_len=1)
        return PreparedBatch(self.input_ids[:size], self.positions[:size], meta, self.rows[:size])

    def size_for(self, prepared: PreparedBatch) -> int | None:
        """The captured size that replays this batch; None: it runs eagerly (prefills, too many
        requests, or a table wider than captured)."""
        meta = prepared.meta
        if meta.num_prefills or meta.block_tables.shape[1] > self.block_tables.shape[1]:
            return None
        return next((size for size in self.sizes if size >= meta.num_decodes), None)

    def replay(self, prepared: PreparedBatch, size: int) -> torch.Tensor:
        """The logits of ``prepared``'s rows from the graph of ``size`` (a view its next replay overwrites)."""
        meta = prepared.meta
        n, width = meta.num_decodes, meta.block_tables.shape[1]
        self.input_ids[:n].copy_(prepared.input_ids, non_blocking=True)
        self.positions[:n].copy_(prepared.positions, non_blocking=True)
        self.slots[:n].copy_(meta.slot_mapping, non_blocking=True)
        self.seq_lens[:n].copy_(meta.seq_lens, non_blocking=True)
        # Entries past a request's context are never read, so the rest of its row may stay stale.
        self.block_tables[:n, :width].copy_(meta.block_tables, non_blocking=True)
        if n < size:
            self.slots[n:size].fill_(-1)
            self.seq_lens[n:size].fill_(0)
        replay, out = self.graphs[size]
        replay()
        return out[:n]
