"""How a batch's paged attention is launched, decided on the host from shapes and hints alone (no
device sync, no Triton): the tile shape, the grid, and into how many programs each tile's KV walk is
split.

Why split: a program owns one tile of query rows of one KV head and walks that tile's whole context.
A prefill chunk of a few tiles, or a decode batch of a few requests, is then fewer programs than the
GPU has SMs, each walking a long context alone while most SMs idle. As FlashDecoding and FlashInfer
do, such a launch splits every tile's walk across ``num_splits`` programs (the grid's third axis);
each writes its partial output and log-sum-exp, and a small merge kernel combines them
(``split_merge.py``). The split count depends only on what a CUDA graph fixes at capture (token and
request counts, the block table's width); each program finds its share of the keys on the device
from the request's ``seq_len``, so any split count is right for any context lengths.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sarathi_kernels._checks import require

# A launch of fewer programs than this per SM leaves SMs idle or with one program to hide a walk's
# memory latency behind: FlashInfer sizes its split-KV grid to the SMs' resident programs, about two
# per SM for these tile sizes.
TARGET_PROGRAMS_PER_SM = 2
# A launch this close to the target runs unsplit: a split adds a partial output per query row (written,
# then read by the merge), which a big prefill's many rows pay for with no idle SM to win back.
UNSPLIT_SHARE = 0.9
# A cap on the partial buffers (tokens x heads x splits x head_dim fp32) and on the merge's serial loop
# over splits. 32 lets a single decode of a model with 8 KV heads reach two programs a SM; prefill
# tiles, with many rows each, reach the target long before it.
MAX_SPLITS = 32


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def plan_splits(programs: int, num_sms: int | None, max_key_tiles: int) -> int:
    """Into how many programs each tile's KV walk is split: enough to give the launch
    ``TARGET_PROGRAMS_PER_SM`` programs a SM, at most ``MAX_SPLITS`` and at most ``max_key_tiles``
    (the longest walk's key tiles: a split of none would be a program with nothing to do).
    ``programs``: the unsplit launch's programs that have work; ``num_sms`` None (no GPU): 1."""
    if num_sms is None or programs <= 0:
        return 1
    target = TARGET_PROGRAMS_PER_SM * num_sms
    if programs >= UNSPLIT_SHARE * target:
        return 1
    return max(1, min(cdiv(target, programs), MAX_SPLITS, max_key_tiles))


def default_block_m(group_pad: int, max_query_len: int | None) -> int:
    """Decode-only batches fill M with the GQA group; prefills want a taller tile for reuse of K/V:
    64 rows are one Hopper warpgroup's MMA (m64) and a 64-token chunk's whole tile under MHA."""
    rows = 16 if max_query_len == 1 else 64
    return max(rows, group_pad)


@dataclass(frozen=True)
class AttentionLaunch:
    """One launch of the paged attention kernel (and of the merge when ``num_splits > 1``)."""

    group: int  # query heads per KV head
    group_pad: int  # the group padded to a power of two (rows of one token in a tile)
    block_m: int  # tile rows: block_q tokens x group_pad heads
    block_n: int  # keys per step of the walk
    grid_tiles: int  # the grid's first axis: an upper bound on tiles, from shapes alone
    working_tiles: int  # at most this many of them have rows to compute
    num_kv_heads: int
    num_splits: int
    num_warps: int
    num_stages: int | None  # None: Triton's default

    @property
    def block_q(self) -> int:
        return self.block_m // self.group_pad

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.grid_tiles, self.num_kv_heads, self.num_splits

    @property
    def working_programs(self) -> int:
        return self.working_tiles * self.num_kv_heads * self.num_splits

    def launch_options(self) -> dict[str, int]:
        options = {"num_warps": self.num_warps}
        if self.num_stages is not None:
            options["num_stages"] = self.num_stages
        return options


def plan_launch(num_tokens: int, num_requests: int, num_heads: int, num_kv_heads: int, *, max_seq_len: int,
                element_size: int = 2, max_query_len: int | None = None, num_sms: int | None = None,
                block_m: int | None = None, block_n: int | None = None, num_splits: int | None = None,
                num_warps: int | None = None, num_stages: int | None = None) -> AttentionLaunch:
    """The launch of a batch of ``num_tokens`` query tokens in ``num_requests`` requests whose longest
    context is at most ``max_seq_len``. ``max_query_len`` is a tiling hint (1: decode-only);
    ``num_sms`` None: no split. The keywords after it override the tiling, the split count and the
    compiler's warps/stages, for benchmarks and tests."""
    group = num_heads // num_kv_heads
    group_pad = 1 << (group - 1).bit_length()
    block_m = block_m or default_block_m(group_pad, max_query_len)
    # fp32 K/V tiles of 64 positions overflow the ~100 KB of shared memory of consumer GPUs.
    block_n = block_n or (64 if element_size == 2 else 32)
    require(block_m >= max(16, group_pad) and block_m & (block_m - 1) == 0,
            f"block_m must be a power of two >= max(16, GQA group {group_pad}), got {block_m}")
    require(block_n >= 16 and block_n & (block_n - 1) == 0, f"block_n must be a power of two >= 16, got {block_n}")
    require(num_splits is None or num_splits >= 1, f"num_splits must be >= 1, got {num_splits}")
    block_q = block_m // group_pad
    # Request i owns tiles from query_start_loc[i] // block_q + i (paged_attention.py), so the grid needs
    # T // block_q + R; of those, each request's ceil(q_len / block_q) have rows, at most
    # ceil(T / block_q) + R - 1 in all and R * ceil(max_query_len / block_q).
    grid_tiles = num_tokens // block_q + num_requests
    working_tiles = cdiv(num_tokens, block_q) + num_requests - 1
    if max_query_len is not None:
        working_tiles = min(working_tiles, num_requests * cdiv(max_query_len, block_q))
    if num_splits is None:
        num_splits = plan_splits(working_tiles * num_kv_heads, num_sms, cdiv(max_seq_len, block_n))
    # One warpgroup (4 warps) per 64 rows: a 128-row tile on 4 warps holds a 128 x head_dim fp32
    # accumulator in 128 threads' registers and spills (FlashAttention's Triton kernels take 8 warps
    # for 128-row tiles of head_dim 128).
    num_warps = num_warps or (8 if block_m >= 128 else 4)
    return AttentionLaunch(group, group_pad, block_m, block_n, grid_tiles, working_tiles, num_kv_heads, num_splits,
                           num_warps, num_stages)


_SM_COUNTS: dict[int, int] = {}


def device_sm_count(device: torch.device) -> int | None:
    """The SMs of a CUDA device (cached: asked once per device); None elsewhere (the interpreter)."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNTS:
        _SM_COUNTS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNTS[index]
