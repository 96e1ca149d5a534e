"""The merge of a split KV walk (attention_plan.py says when and why a walk is split): each split of
each (token, head) left its output normalised over its own keys and their log-sum-exp (base 2), both
fp32; the row's output is the splits' outputs weighted by exp2(lse - max lse), over the weights' sum.

A split that saw no key of a row (a causal tail past the row, or a padded request of context 0) left
lse = -inf and output 0: weight 0. A row no split saw gets 0, never 0/0.
"""
from __future__ import annotations

import torch
import triton.language as tl

from sarathi_kernels._checks import padded_head_dim
from sarathi_kernels.triton_jit import jit

# Heads merged by one program: with head_dim 128, 16 fp32 rows are 16 registers a thread on 4 warps.
MAX_MERGE_HEADS = 16


@jit(do_not_specialize=("num_splits",))
def _merge_splits_kernel(part_ptr, lse_ptr, out_ptr, num_heads, num_splits, head_dim, stride_ot, stride_oh,
                         BLOCK_H: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs_h < num_heads
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < head_dim
    # Partials are [tokens, heads, splits, head_dim]; lse [tokens, heads, splits].
    rows = (tok * num_heads + offs_h) * num_splits
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    for s in range(num_splits):
        m = tl.maximum(m, tl.load(lse_ptr + rows + s, mask=h_ok, other=float("-inf")))
    m = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros([BLOCK_H, HEAD_DIM_PAD], tl.float32)
    total = tl.zeros([BLOCK_H], tl.float32)
    for s in range(num_splits):
        w = tl.exp2(tl.load(lse_ptr + rows + s, mask=h_ok, other=float("-inf")) - m)
        part = tl.load(part_ptr + (rows + s)[:, None] * head_dim + offs_d[None, :],
                       mask=h_ok[:, None] & d_ok[None, :], other=0.0)
        acc += w[:, None] * part
        total += w
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(out_ptr + tok * stride_ot + (offs_h * stride_oh)[:, None] + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=h_ok[:, None] & d_ok[None, :])


def split_buffers(num_tokens: int, num_heads: int, num_splits: int, head_dim: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the splits leave their partial outputs and log-sum-exps (every row each split owns is written)."""
    part = torch.empty(num_tokens, num_heads, num_splits, head_dim, dtype=torch.float32, device=device)
    lse = torch.empty(num_tokens, num_heads, num_splits, dtype=torch.float32, device=device)
    return part, lse


def merge_splits(part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor) -> None:
    """``out`` [tokens, heads, head_dim] from the splits' partials (``split_buffers``)."""
    num_tokens, num_heads, num_splits, head_dim = part.shape
    block_h = min(MAX_MERGE_HEADS, 1 << (num_heads - 1).bit_length())
    grid = (num_tokens, -(-num_heads // block_h))
    _merge_splits_kernel[grid](part, lse, out, num_heads, num_splits, head_dim, out.stride(0), out.stride(1),
                               BLOCK_H=block_h, HEAD_DIM_PAD=padded_head_dim(head_dim))
