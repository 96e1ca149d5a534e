"""The merge of a split KV walk (attention_plan.py says when and why a walk is split): each split of
each (token, head) left its output normalised over its own keys and their log-sum-exp (base 2), both
fp32; the row's output is the splits' outputs weighted by exp2(lse - max lse), over the weights' sum.

The split count is a device integer, so that a CUDA graph's replays can change it; a merge whose
launch ran unsplit (count 1) exits at once.

A split that saw no key of a row (a causal tail past the row, or a padded request of context 0) left
lse = -inf and output 0: weight 0. A row no split saw gets 0, never 0/0.
"""
from __future__ import annotations

import torch
import triton.language as tl

from sarathi_kernels._checks import padded_head_dim, require
from sarathi_kernels.split_rule import MAX_SPLIT_COUNT
from sarathi_kernels.triton_jit import jit

# Heads merged by one program: with head_dim 128, 16 fp32 rows are 16 registers a thread on 4 warps.
MAX_MERGE_HEADS = 16


@jit
def _merge_splits_kernel(part_ptr, lse_ptr, out_ptr, plan_ptr, query_start_loc_ptr, row_splits_ptr, num_heads,
                         head_dim, group, stride_ot, stride_oh, BLOCK_H: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                         DECODE: tl.constexpr, ROW_SPLITS: tl.constexpr):
    # plan: split count (the partials' stride), first request, end request of the attention launch merged.
    num_splits = tl.load(plan_ptr)
    if num_splits == 1:  # the attention launch stored its output itself
        return
    row = tl.program_id(0)
    if DECODE:  # row: a request, its one token
        if row < tl.load(plan_ptr + 1) or row >= tl.load(plan_ptr + 2):
            return
        tok = tl.load(query_start_loc_ptr + row).to(tl.int64)
    else:  # row: a token of the launch's requests
        if row >= tl.load(query_start_loc_ptr + tl.load(plan_ptr + 2)):
            return
        tok = row.to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs_h < num_heads
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < head_dim
    # Partials are [rows, heads, splits, head_dim]; lse [rows, heads, splits].
    rows = (row.to(tl.int64) * num_heads + offs_h) * num_splits
    if ROW_SPLITS:
        # Balanced work (chunk_attention.py): each (token, KV head) has its own tile's piece count, and
        # a tile of one piece stored its output itself.
        counts = tl.load(row_splits_ptr + row.to(tl.int64) * (num_heads // group) + offs_h // group, mask=h_ok,
                         other=1)
        h_ok = h_ok & (counts > 1)
        walk = tl.max(counts, 0)
    else:
        counts = tl.full([BLOCK_H], num_splits, tl.int32)
        walk = num_splits
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    for s in range(walk):
        m = tl.maximum(m, tl.load(lse_ptr + rows + s, mask=h_ok & (s < counts), other=float("-inf")))
    m = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros([BLOCK_H, HEAD_DIM_PAD], tl.float32)
    total = tl.zeros([BLOCK_H], tl.float32)
    for s in range(walk):
        ok = h_ok & (s < counts)
        w = tl.exp2(tl.load(lse_ptr + rows + s, mask=ok, other=float("-inf")) - m)
        part = tl.load(part_ptr + (rows + s)[:, None] * head_dim + offs_d[None, :],
                       mask=ok[:, None] & d_ok[None, :], other=0.0)
        acc += w[:, None] * part
        total += w
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(out_ptr + tok * stride_ot + (offs_h * stride_oh)[:, None] + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=h_ok[:, None] & d_ok[None, :])


def split_buffers(rows: int, num_heads: int, most_splits: int, head_dim: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Where up to ``most_splits`` splits leave their partial outputs and log-sum-exps, laid out
    [rows, heads, splits, head_dim] for the split count the launch reads (every row each split owns is
    written)."""
    part = torch.empty(rows, num_heads, most_splits, head_dim, dtype=torch.float32, device=device)
    lse = torch.empty(rows, num_heads, most_splits, dtype=torch.float32, device=device)
    return part, lse


# Launches' device integers (attention_plan.AttentionLaunch.device_row), a row of 16 bytes each so that
# every row a launch reads is aligned alike (an alignment is part of a compiled kernel's key): an eager
# launch reads a row kept here for its values, made once.
_PLAN_ROWS: dict[tuple[torch.device, tuple[int, ...]], torch.Tensor] = {}
# Rows kept at most; past it they are made anew (a long run meets few batch shapes' rows).
MAX_PLAN_ROWS = 4096


def split_counts_buffer(rows: int, device: torch.device) -> torch.Tensor:
    """int32 [rows, 4]: a launch's device integers a row (split count 1: unsplit)."""
    buffer = torch.zeros(rows, 4, dtype=torch.int32, device=device)
    buffer[:, 0] = 1
    return buffer


def plan_row(device: torch.device, values: tuple[int, int, int, int]) -> torch.Tensor:
    """A device row holding ``values`` (split count, first request, end request, 0)."""
    require(1 <= values[0] <= MAX_SPLIT_COUNT, f"num_splits must be in [1, {MAX_SPLIT_COUNT}], got {values[0]}")
    key = (device, values)
    if key not in _PLAN_ROWS:
        if len(_PLAN_ROWS) >= MAX_PLAN_ROWS:
            _PLAN_ROWS.clear()
        _PLAN_ROWS[key] = torch.tensor([values], dtype=torch.int32, device=device)[0]
    return _PLAN_ROWS[key]


def merge_splits(part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, plan: torch.Tensor,
                 query_start_loc: torch.Tensor, decode: bool = False, row_splits: torch.Tensor | None = None,
                 group: int = 1) -> None:
    """``out`` [tokens, heads, head_dim] from the splits' partials (``split_buffers``) of the launch whose
    device integers are ``plan`` (its split count and requests); ``decode``: the partials' rows are
    requests (a decode launch's), else tokens. ``row_splits`` int32 [tokens, kv_heads]: each token's
    own split count per KV head of ``group`` query heads (balanced work); None: the launch's count."""
    rows, num_heads, _, head_dim = part.shape
    block_h = min(MAX_MERGE_HEADS, 1 << (num_heads - 1).bit_length())
    grid = (rows, -(-num_heads // block_h))
    _merge_splits_kernel[grid](part, lse, out, plan, query_start_loc, plan if row_splits is None else row_splits,
                               num_heads, head_dim, group, out.stride(0), out.stride(1), BLOCK_H=block_h,
                               HEAD_DIM_PAD=padded_head_dim(head_dim), DECODE=decode,
                               ROW_SPLITS=row_splits is not None)
