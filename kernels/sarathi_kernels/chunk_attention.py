"""The prefill chunks' attention on a persistent grid of balanced work (chunk_plan.py): program p walks
the pieces ``work_indptr[p]:work_indptr[p + 1]``, each a key range of one (q-tile, KV head) walk of
paged_attention.py's (its tiles, its key-tile step ``_attend_kv_tile``, its bottom-right causal
mask). A piece that is its tile's only one stores the output; the pieces of a split walk leave fp32
partials and log-sum-exps in split_merge.py's layout, which its merge combines per token and head
(``row_splits``). The work sits in buffers of a fixed capacity (``ChunkBuffers``), so that a CUDA graph
can replay the grid over any batch's plan copied into them.
"""
from __future__ import annotations

import torch
import triton.language as tl

from sarathi_kernels._checks import padded_head_dim, require
from sarathi_kernels.attention_tile import _LOG2E, _dot_dtype, _no_partials, _walk_keys
from sarathi_kernels.chunk_plan import ITEM_FIELDS, ChunkWork
from sarathi_kernels.split_merge import merge_splits, split_buffers
from sarathi_kernels.triton_jit import jit


@jit
def _attend_piece(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_ptr, lse_ptr, query_start_loc_ptr, seq_lens_ptr,
                  block_tables_ptr, item, num_heads, head_dim, scale_log2, split_stride,
                  stride_qt, stride_qh, stride_ot, stride_oh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs,
                  stride_vh, stride_bt, BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                  HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP_PAD
    req = tl.load(item)
    kv_head = tl.load(item + 1)
    first_q = tl.load(item + 2)
    lo = tl.load(item + 3)
    split = tl.load(item + 5)
    splits = tl.load(item + 6)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + req)
    prefix = seq_len - q_len

    offs_m = tl.arange(0, BLOCK_M)
    tok = first_q + offs_m // GROUP_PAD
    in_group = offs_m % GROUP_PAD
    head = kv_head * GROUP + in_group
    row_ok = (tok < q_len) & (in_group < GROUP)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < head_dim
    q_rows = (q_start + tok).to(tl.int64) * stride_qt + head * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    q = q.to(DOT_DTYPE)

    # paged_attention's walk, over this piece's keys only.
    row_limit = prefix + tok
    kv_end = tl.minimum(seq_len, prefix + first_q + BLOCK_Q)
    hi = tl.minimum(tl.load(item + 4), kv_end)
    full_end = ((prefix + first_q + 1) // BLOCK_N) * BLOCK_N
    table_ptr = block_tables_ptr + req.to(tl.int64) * stride_bt
    k_ptr = k_cache_ptr + kv_head * stride_kh
    v_ptr = v_cache_ptr + kv_head * stride_vh
    acc, m_i, l_i = _walk_keys(q, lo, hi, full_end, kv_end, row_limit, table_ptr, k_ptr, v_ptr, stride_kb,
                               stride_ks, stride_vb, stride_vs, offs_d, d_ok, scale_log2, BLOCK_M, HEAD_DIM_PAD,
                               BLOCK_SIZE, BLOCK_N, DOT_DTYPE, PRECISION)
    # A row that saw no key in this piece (its causal limit before the piece) has l == 0: output 0.
    seen = l_i > 0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    out_ok = row_ok[:, None] & d_ok[None, :]
    if splits == 1:
        o_rows = (q_start + tok).to(tl.int64) * stride_ot + head * stride_oh
        tl.store(out_ptr + o_rows[:, None] + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=out_ok)
    else:
        part_rows = ((q_start + tok).to(tl.int64) * num_heads + head) * split_stride + split
        tl.store(part_ptr + part_rows[:, None] * head_dim + offs_d[None, :], out, mask=out_ok)
        lse = m_i + tl.log2(tl.where(seen, l_i, 1.0))
        tl.store(lse_ptr + part_rows, tl.where(seen, lse, float("-inf")), mask=row_ok)


# The split stride and the work are read at run time: a batch of another shape runs the same compile.
@jit(do_not_specialize=("stride_bt", "split_stride"))
def _chunk_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_ptr, lse_ptr, query_start_loc_ptr, seq_lens_ptr,
    block_tables_ptr, work_indptr_ptr, items_ptr, num_heads, head_dim, scale_log2, split_stride,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
    BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    ITEM_FIELDS: tl.constexpr,
):
    program = tl.program_id(0)
    first = tl.load(work_indptr_ptr + program)
    last = tl.load(work_indptr_ptr + program + 1)
    for w in range(first, last):
        _attend_piece(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_ptr, lse_ptr, query_start_loc_ptr,
                      seq_lens_ptr, block_tables_ptr, items_ptr + w * ITEM_FIELDS, num_heads, head_dim,
                      scale_log2, split_stride, stride_qt, stride_qh, stride_ot, stride_oh,
                      stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
                      BLOCK_SIZE, GROUP, GROUP_PAD, HEAD_DIM_PAD, BLOCK_M, BLOCK_N, DOT_DTYPE, PRECISION)


class ChunkBuffers:
    """A plan's device buffers, of a fixed capacity so that their addresses outlive any one batch:
    ``work_indptr`` int32 [programs + 1], ``items`` int32 [capacity, ITEM_FIELDS], ``row_splits``
    int32 [tokens, kv_heads] (the merge's), and the merge's device integers (split stride, 0, the
    chunks' request count)."""

    def __init__(self, programs: int, capacity: int, tokens: int, kv_heads: int, split_capacity: int,
                 device: torch.device):
        self.programs, self.capacity, self.split_capacity = programs, capacity, split_capacity
        self.work_indptr = torch.zeros(programs + 1, dtype=torch.int32, device=device)
        self.items = torch.zeros(max(capacity, 1), ITEM_FIELDS, dtype=torch.int32, device=device)
        self.row_splits = torch.ones(max(tokens, 1), kv_heads, dtype=torch.int32, device=device)
        self.merge_row = torch.tensor([split_capacity, 0, 0, 0], dtype=torch.int32, device=device)

    def load(self, work: ChunkWork, num_requests: int) -> None:
        """Copy ``work`` in (host to device, no sync): a graph captured over these buffers replays it."""
        require(work.programs <= self.programs and len(work.items) <= self.capacity
                and work.split_capacity <= self.split_capacity and len(work.row_splits) <= len(self.row_splits),
                f"plan of {work.programs} programs, {len(work.items)} pieces, {work.split_capacity} splits a "
                f"tile does not fit buffers of {self.programs}, {self.capacity}, {self.split_capacity}")
        indptr = torch.from_numpy(work.work_indptr)
        self.work_indptr[: len(indptr)].copy_(indptr, non_blocking=True)
        self.work_indptr[len(indptr):].fill_(int(work.work_indptr[-1]))
        self.items[: len(work.items)].copy_(torch.from_numpy(work.items), non_blocking=True)
        self.row_splits[: len(work.row_splits)].copy_(torch.from_numpy(work.row_splits), non_blocking=True)
        self.merge_row[2] = num_requests

    def clear(self) -> None:
        """No work: every program and the merge exit at once."""
        self.work_indptr.zero_()
        self.merge_row[2] = 0


def chunk_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                    buffers: ChunkBuffers, scale: float, out: torch.Tensor, *, group_pad: int, block_m: int,
                    block_n: int, split: bool, num_warps: int = 4, num_stages: int | None = None) -> None:
    """The chunks' rows of ``out`` (paged_attention's arguments and layout) from the work ``buffers``
    hold (``buffers.load(work)`` first); ``split``: whether any walk was cut (then the merge runs)."""
    tokens, num_heads, head_dim = query.shape
    group = num_heads // k_cache.shape[2]
    if split:
        part, lse = split_buffers(tokens, num_heads, buffers.split_capacity, head_dim, query.device)
    else:
        part = lse = _no_partials(query.device)  # never written: no piece is split
    options = {"num_warps": num_warps} | ({"num_stages": num_stages} if num_stages is not None else {})
    _chunk_attention_kernel[(buffers.programs,)](
        query, k_cache, v_cache, out, part, lse, query_start_loc, seq_lens, block_tables, buffers.work_indptr,
        buffers.items, num_heads, head_dim, scale * _LOG2E, buffers.split_capacity,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        BLOCK_SIZE=k_cache.shape[1], GROUP=group, GROUP_PAD=group_pad, HEAD_DIM_PAD=padded_head_dim(head_dim),
        BLOCK_M=block_m, BLOCK_N=block_n, DOT_DTYPE=_dot_dtype(query.dtype),
        # fp32 must stay fp32: the default tf32 dot would miss the reference by ~1e-3.
        PRECISION="ieee" if query.dtype == torch.float32 else None, ITEM_FIELDS=ITEM_FIELDS, **options,
    )
    if split:
        merge_splits(part, lse, out, buffers.merge_row, query_start_loc, row_splits=buffers.row_splits,
                     group=group)
