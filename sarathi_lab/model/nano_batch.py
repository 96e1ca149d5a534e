"""NanoFlow's nano-batches: a hybrid batch cut in two by token, one's attention on a second stream
beside the other's GEMMs; a cut prefill runs as two chunks, so outputs match up to rounding."""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, replace
from itertools import accumulate

import torch

from sarathi_lab.attention import AttentionMetadata
from sarathi_lab.engine.tiles import GEMM_TILE
from sarathi_lab.tuned_kernels import TunedTable

# Below this, GEMMs at half the tokens fall under the ridge point: the cut costs more than it wins.
# The default where the device's tuned table has no ``overlap`` entry.
MIN_OVERLAP_TOKENS = 384


@dataclass(frozen=True)
class OverlapRule:
    """The one home of which batches run as two nano-batches and where they are cut."""

    mode: str = "none"
    min_tokens: int = MIN_OVERLAP_TOKENS
    tile: int = GEMM_TILE

    def cut(self, tokens: int, prefill_tokens: int, decodes: int) -> int | None:
        """All prefill, so the decodes' attention runs beside the first's GEMMs."""
        if self.mode != "nano_batch" or tokens < self.min_tokens:
            return None
        if not prefill_tokens or not decodes:
            return None
        at = min(-(-tokens // self.tile) // 2 * self.tile, prefill_tokens)
        return at if 0 < at < tokens else None

    @classmethod
    def of_table(cls, mode: str, table: TunedTable) -> OverlapRule:
        """``mode`` as configured, unless the device's table turns overlap off; its threshold."""
        on = table.overlap.get("enabled", True)
        return cls(mode if on else "none", table.overlap.get("min_tokens", MIN_OVERLAP_TOKENS))


NO_OVERLAP = OverlapRule()


def split_meta(meta: AttentionMetadata, at: int) -> tuple[AttentionMetadata, AttentionMetadata]:
    """A prefill cut at ``at`` is in both parts."""
    lens, seqs = meta.query_lens_host, meta.seq_lens_host
    ends = list(accumulate(lens))
    if not 0 < at < ends[-1]:
        raise ValueError(f"a nano-batch cut at token {at} of {ends[-1]} leaves one nano-batch "
                         "empty")
    i = next(r for r, end in enumerate(ends) if end >= at)  # the request holding token at - 1
    first_len = at - (ends[i] - lens[i])
    cut = first_len < lens[i]
    if cut and i >= meta.num_prefills:
        raise ValueError(f"a nano-batch cut at token {at} would cut decode {i - meta.num_prefills}")
    head = (lens[:i] + [first_len], seqs[:i] + [seqs[i] - (lens[i] - first_len)])
    tail = (([lens[i] - first_len] if cut else []) + lens[i + 1:], seqs[i + (not cut):])
    rows = ((0, i + 1), (i + (not cut), len(lens)))
    return (_part(meta, head, rows[0], slice(0, at)),
            _part(meta, tail, rows[1], slice(at, None)))


def _part(meta: AttentionMetadata, lens_seqs: tuple[list[int], list[int]], rows: tuple[int, int],
          tokens: slice) -> AttentionMetadata:
    lens, seqs = lens_seqs
    lo, hi = rows
    prefills = max(0, min(hi, meta.num_prefills) - lo)
    dev, i32 = meta.seq_lens.device, torch.int32
    return replace(meta, num_prefills=prefills, num_decodes=len(lens) - prefills,
                   num_prefill_tokens=sum(lens[:prefills]),
                   query_start_loc=torch.tensor([0, *accumulate(lens)], dtype=i32, device=dev),
                   seq_lens=torch.tensor(seqs, dtype=i32, device=dev),
                   block_tables=meta.block_tables[lo:hi], slot_mapping=meta.slot_mapping[tokens],
                   query_lens_host=list(lens), seq_lens_host=list(seqs), max_query_len=max(lens),
                   plan=None)


@dataclass
class NanoBatch:

    tokens: slice
    positions: torch.Tensor
    meta: AttentionMetadata


def nano_batches(positions: torch.Tensor, meta: AttentionMetadata,
                 at: int) -> tuple[NanoBatch, NanoBatch]:
    first, second = split_meta(meta, at)
    return (NanoBatch(slice(0, at), positions[:at], first),
            NanoBatch(slice(at, None), positions[at:], second))


def overlapped_layers(layers, hidden: torch.Tensor, kv_caches, parts: tuple[NanoBatch, ...],
                      streams: InOrder | CudaStreams) -> tuple[torch.Tensor, torch.Tensor]:
    """Per layer, each part's attention on the side stream, the rest on the main one."""
    hidden = [hidden[p.tokens] for p in parts]
    residual: list = [None] * len(parts)
    out: list = [None] * len(parts)
    done: list = [None] * len(parts)
    previous = None
    for layer, kv_cache in zip(layers, kv_caches):
        for i, part in enumerate(parts):
            if previous is not None:
                streams.wait("main", done[i])
                hidden[i], residual[i] = previous.post_attention(out[i], residual[i])
            q, residual[i] = layer.pre_attention(part.positions, hidden[i], residual[i], kv_cache,
                                                 part.meta)
            ready = streams.mark("main")
            with streams.on_side():
                streams.wait("side", ready)
                out[i] = layer.self_attn.attend(q, kv_cache, part.meta)
                done[i] = streams.mark("side")
            streams.hand(q, "side")
            streams.hand(out[i], "main")
        previous = layer
    for i in range(len(parts)):
        streams.wait("main", done[i])
        hidden[i], residual[i] = previous.post_attention(out[i], residual[i])
    return torch.cat(hidden), torch.cat(residual)


class InOrder:
    """The CPU's one stream: marks, waits and hand-overs are nothing."""

    def mark(self, stream: str):
        return None

    def wait(self, stream: str, event) -> None:
        pass

    def on_side(self):
        return contextlib.nullcontext()

    def hand(self, tensor: torch.Tensor, stream: str) -> None:
        pass


@functools.cache
def _side_stream(device: torch.device):
    return torch.cuda.Stream(device)


class CudaStreams:
    """The two streams ("main", "side"), joined by events as a multi-stream graph capture asks."""

    def __init__(self, device: torch.device):
        self.streams = {"main": torch.cuda.current_stream(device), "side": _side_stream(device)}

    def mark(self, stream: str):
        event = torch.cuda.Event()
        event.record(self.streams[stream])
        return event

    def wait(self, stream: str, event) -> None:
        self.streams[stream].wait_event(event)

    def on_side(self):
        return torch.cuda.stream(self.streams["side"])

    def hand(self, tensor: torch.Tensor, stream: str) -> None:
        """The allocator must not reuse ``tensor`` before ``stream``'s work on it is done."""
        tensor.record_stream(self.streams[stream])


def streams_for(device: torch.device) -> InOrder | CudaStreams:
    return CudaStreams(device) if device.type == "cuda" else InOrder()
