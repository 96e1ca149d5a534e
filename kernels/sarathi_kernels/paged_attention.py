"""Paged varlen attention over a Sarathi hybrid batch (prefill chunks, then decodes): one launch a
work kind (attention_plan.py), prefill tiles over the chunks and decode tiles over the one-token requests.

Program (tile, kv_head, split) owns up to BLOCK_Q query tokens of one request times the GROUP query
heads that share ``kv_head``: the M rows of the tile are (token, head-in-group) pairs. Packing the
group into M lets one load of a key/value tile serve every head that uses it, which is what makes
decode (one token, memory-bound) cheap under GQA. Tiles never straddle requests; request i owns tiles
``query_start_loc[i] // BLOCK_Q + i`` onwards, an upper bound on the tiles of the requests before
it, so a program finds its request by binary search without any host-side tile map, and the grid
``T // BLOCK_Q + R`` comes from shapes alone (no device sync). Programs past a request's last tile
exit at once; a request's last tile (the longest causal walk) takes its first program. A decode
launch's tile t is its first request + t, one token. Programs are a flat grid, program p being split
p % S of (tile, kv_head) p // S, S the split count, which with the launch's range of requests the
kernel reads from the device (attention_plan.py: what lets a CUDA graph replay any batch's plan).

When a batch has too few programs to fill the GPU (attention_plan.py), each tile's walk over its keys
is split across ``num_splits`` programs (read from the device: a CUDA graph's replays refill it, and
programs of the grid past it exit at once): split s takes its share of the tile's key tiles, counted on
the device from the request's ``seq_len``, and leaves a partial output and log-sum-exp that
split_merge.py combines. Unsplit, the program normalises and stores the output itself.

Keys are walked in BLOCK_N position tiles. Where a key tile lies inside one cache block (BLOCK_SIZE a
multiple of BLOCK_N) it is addressed from one block-table entry; otherwise through the table per
position, so BLOCK_N and the cache block size are independent. Positions every row of the tile may
see run without a mask; only the causal tail pays for one.
"""
from __future__ import annotations

import math

import torch
import triton.language as tl

from sarathi_kernels._checks import (
    FLOAT_DTYPES,
    padded_head_dim,
    require,
    require_dim,
    require_int,
    require_same_device,
    require_unit_last_stride,
)
from sarathi_kernels.attention_plan import DECODE, PREFILL, AttentionPlan, plan_launch
from sarathi_kernels.attention_tile import _LOG2E, _dot_dtype, _no_partials, _walk_keys
from sarathi_kernels.chunk_attention import ChunkBuffers, chunk_attention
from sarathi_kernels.occupancy import device_limits
from sarathi_kernels.split_merge import merge_splits, plan_row, split_buffers
from sarathi_kernels.triton_jit import jit


@jit
def _find_request(query_start_loc_ptr, num_requests, tile, BLOCK_Q: tl.constexpr):
    lo = 0
    hi = num_requests
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_tile <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1



# The per-batch integers stay out of the specialisation key: a batch of a new shape runs the kernel
# compiled for the first. The split count is read from the device (a CUDA graph's replays refill it).
# The per-batch integers stay out of the specialisation key: a batch of a new shape runs the kernel
# compiled for the first. The split count and the launch's requests are read from the device (a CUDA
# graph's replays refill them).
@jit(do_not_specialize=("stride_bt",))
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_ptr, lse_ptr,
    query_start_loc_ptr, seq_lens_ptr, block_tables_ptr, plan_ptr,
    num_kv_heads, num_heads, head_dim, scale_log2,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
    # The cache block size is a constexpr so that position -> (block, offset) is a shift and a mask.
    BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    # DECODE: tile t is request first_request + t's one token; else tiles of BLOCK_Q tokens of requests
    # up to end_request.
    DECODE: tl.constexpr,
):
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP_PAD
    # plan: split count, first request, end request (attention_plan.AttentionLaunch.device_row).
    num_splits = tl.load(plan_ptr)
    pid = tl.program_id(0)
    split = pid % num_splits
    rest = pid // num_splits
    kv_head = rest % num_kv_heads
    tile = rest // num_kv_heads
    if DECODE:
        req = tl.load(plan_ptr + 1) + tile
        if req >= tl.load(plan_ptr + 2):
            return
        q_start = tl.load(query_start_loc_ptr + req)
        q_len = 1  # a decode launch's requests are the batch's decodes
        first_q = 0
    else:
        req = _find_request(query_start_loc_ptr, tl.load(plan_ptr + 2), tile, BLOCK_Q)
        q_start = tl.load(query_start_loc_ptr + req)
        q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
        q_tiles = tl.cdiv(q_len, BLOCK_Q)
        local = tile - (q_start // BLOCK_Q + req)
        if local >= q_tiles:
            return
        # The request's last tile first: causally it walks the most keys, so the short walks fill the
        # last wave.
        first_q = (q_tiles - 1 - local) * BLOCK_Q
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

    # Bottom-right causal: token r of the chunk sits at position prefix + r. Rows past q_len get a
    # limit beyond the context, so they too see keys and stay finite; they are never stored.
    row_limit = prefix + tok
    kv_end = tl.minimum(seq_len, prefix + first_q + BLOCK_Q)
    # Keys up to prefix + first_q are visible to every row; the first masked tile starts at or
    # before that position, so no row meets an all-masked first tile of an unsplit walk.
    full_end = ((prefix + first_q + 1) // BLOCK_N) * BLOCK_N
    # This split's share of the tile's key tiles, from this request's seq_len: right for any context
    # whatever split count the host chose. Shares differ by at most one key tile.
    key_tiles = tl.cdiv(kv_end, BLOCK_N)
    lo = (split * key_tiles // num_splits) * BLOCK_N
    hi = tl.minimum(((split + 1) * key_tiles // num_splits) * BLOCK_N, kv_end)

    table_ptr = block_tables_ptr + req.to(tl.int64) * stride_bt
    k_ptr = k_cache_ptr + kv_head * stride_kh
    v_ptr = v_cache_ptr + kv_head * stride_vh
    acc, m_i, l_i = _walk_keys(q, lo, hi, full_end, kv_end, row_limit, table_ptr, k_ptr, v_ptr, stride_kb,
                               stride_ks, stride_vb, stride_vs, offs_d, d_ok, scale_log2, BLOCK_M, HEAD_DIM_PAD,
                               BLOCK_SIZE, BLOCK_N, DOT_DTYPE, PRECISION)

    # A row that saw no key here (a split past it; a padded request of context 0) has l == 0 and
    # acc == 0: its output is 0, not 0/0.
    seen = l_i > 0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    out_ok = row_ok[:, None] & d_ok[None, :]
    if num_splits == 1:
        o_rows = (q_start + tok).to(tl.int64) * stride_ot + head * stride_oh
        tl.store(out_ptr + o_rows[:, None] + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=out_ok)
    else:
        # split_merge.py's layout: partials [rows, heads, splits, head_dim], lse [rows, heads, splits];
        # a row a token, or a request in a decode launch (its one token).
        if DECODE:
            part_tok = req + tok
        else:
            part_tok = q_start + tok
        part_rows = (part_tok.to(tl.int64) * num_heads + head) * num_splits + split
        tl.store(part_ptr + part_rows[:, None] * head_dim + offs_d[None, :], out, mask=out_ok)
        lse = m_i + tl.log2(tl.where(seen, l_i, 1.0))
        tl.store(lse_ptr + part_rows, tl.where(seen, lse, float("-inf")), mask=row_ok)


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                    scale: float | None = None, *, plan: AttentionPlan | None = None,
                    max_query_len: int | None = None, max_seq_len: int | None = None,
                    out: torch.Tensor | None = None, block_m: int | None = None, block_n: int | None = None,
                    num_splits: int | None = None, num_sms: int | None = None, num_warps: int | None = None,
                    num_stages: int | None = None) -> torch.Tensor:
    """Causal attention of a hybrid batch over its paged KV cache: one kernel launch a work kind
    (prefill chunks, decodes), each followed by a merge where its KV walk is split.

    query [T, heads, head_dim]; k_cache/v_cache [num_blocks, block_size, kv_heads, head_dim];
    query_start_loc int32 [R + 1]; seq_lens int32 [R] (context including this step's tokens, whose
    keys must already be in the cache); block_tables int32 [R, max_blocks]. ``plan``: the batch's
    launches (attention_plan.plan_batch from its host lengths, or a CUDA graph's plan_graph); without
    one, a single launch planned from shapes and these hints, which change only the launch:
    ``max_query_len`` (1 selects decode tiles) and ``max_seq_len`` (the longest context; default the
    block table's width). ``num_sms`` defaults to the device's (none on the CPU: unsplit).
    ``block_m``/``block_n``/``num_splits``/``num_warps``/``num_stages`` override that plan
    (attention_plan.plan_launch). Values (lengths, block ids) are trusted:
    checking them would cost a device sync per call.
    """
    require_dim("query", query, 3, "[tokens, heads, head_dim]")
    require_dim("k_cache", k_cache, 4, "[num_blocks, block_size, kv_heads, head_dim]")
    require(v_cache.shape == k_cache.shape,
            f"v_cache shape {tuple(v_cache.shape)} differs from k_cache shape {tuple(k_cache.shape)}")
    require(query.dtype in FLOAT_DTYPES, f"query dtype must be one of float16/bfloat16/float32, got {query.dtype}")
    require(k_cache.dtype == query.dtype and v_cache.dtype == query.dtype,
            f"query, k_cache and v_cache must share a dtype, got {query.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    require(cache_head_dim == head_dim, f"cache head_dim {cache_head_dim} differs from query head_dim {head_dim}")
    require(num_kv_heads > 0 and num_heads % num_kv_heads == 0,
            f"query heads ({num_heads}) must be a multiple of kv heads ({num_kv_heads})")
    require_int("query_start_loc", query_start_loc, torch.int32, 1)
    require_int("seq_lens", seq_lens, torch.int32, 1)
    require_int("block_tables", block_tables, torch.int32, 2)
    num_requests = seq_lens.shape[0]
    require(query_start_loc.shape[0] == num_requests + 1,
            f"query_start_loc needs {num_requests + 1} entries for {num_requests} requests, "
            f"got {query_start_loc.shape[0]}")
    require(block_tables.shape[0] == num_requests,
            f"block_tables has {block_tables.shape[0]} rows for {num_requests} requests")
    for name, t in (("query", query), ("k_cache", k_cache), ("v_cache", v_cache)):
        require_unit_last_stride(name, t)
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    require(out.shape == query.shape and out.dtype == query.dtype,
            f"out must be {tuple(query.shape)} {query.dtype}, got {tuple(out.shape)} {out.dtype}")
    require_unit_last_stride("out", out)
    require_same_device(query=query, k_cache=k_cache, v_cache=v_cache, out=out, query_start_loc=query_start_loc,
                        seq_lens=seq_lens, block_tables=block_tables)
    if num_requests == 0 or num_tokens == 0:
        return out

    if plan is None:
        launch = plan_launch(num_tokens, num_requests, num_heads, num_kv_heads,
                             max_seq_len=max_seq_len or block_tables.shape[1] * block_size,
                             element_size=query.element_size(), max_query_len=max_query_len, num_sms=num_sms,
                             limits=device_limits(query.device), block_m=block_m, block_n=block_n,
                             num_splits=num_splits, num_warps=num_warps, num_stages=num_stages)
        plan = AttentionPlan(launch, None) if launch.kind == PREFILL else AttentionPlan(None, launch)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    for slot, launch in enumerate((plan.prefill, plan.decode)):
        if launch is None:
            continue
        if launch.balanced is not None:
            _balanced(query, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale, out, launch)
            continue
        row = plan.split_counts[slot] if plan.split_counts is not None else plan_row(query.device,
                                                                                     launch.device_row())
        rows = num_requests if launch.kind == DECODE else num_tokens
        if launch.split_capacity > 1:
            part, lse = split_buffers(rows, num_heads, launch.split_capacity, head_dim, query.device)
        else:
            part = lse = _no_partials(query.device)
        _paged_attention_kernel[launch.grid](
            query, k_cache, v_cache, out, part, lse, query_start_loc, seq_lens, block_tables, row,
            num_kv_heads, num_heads, head_dim, scale * _LOG2E,
            query.stride(0), query.stride(1), out.stride(0), out.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
            BLOCK_SIZE=block_size, GROUP=launch.group, GROUP_PAD=launch.group_pad,
            HEAD_DIM_PAD=padded_head_dim(head_dim), BLOCK_M=launch.block_m, BLOCK_N=launch.block_n,
            DOT_DTYPE=_dot_dtype(query.dtype),
            # fp32 must stay fp32: the default tf32 dot would miss the reference by ~1e-3.
            PRECISION="ieee" if query.dtype == torch.float32 else None,
            DECODE=launch.kind == DECODE, **launch.launch_options(),
        )
        if launch.split_capacity > 1:
            merge_splits(part, lse, out, row, query_start_loc, decode=launch.kind == DECODE)
    return out


def _balanced(query, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale, out, launch) -> None:
    """A launch's balanced work (chunk_attention.py), its buffers made on first use: an eager
    batch's loaded with its work once for every layer, a graph's sized for any batch it holds."""
    balanced = launch.balanced
    if balanced.buffers is None:
        # Plain tensors even inside a forward's inference mode: a graph's replays refill them outside it.
        with torch.inference_mode(False):
            balanced.buffers = ChunkBuffers(balanced.programs, balanced.item_capacity, query.shape[0],
                                            k_cache.shape[2], balanced.split_capacity, query.device)
        if balanced.work is not None:
            balanced.buffers.load(balanced.work, launch.end_request)
    chunk_attention(query, k_cache, v_cache, query_start_loc, seq_lens, block_tables, balanced.buffers, scale, out,
                    group_pad=launch.group_pad, block_m=launch.block_m, block_n=launch.block_n,
                    split=balanced.split_capacity > 1, **launch.launch_options())
