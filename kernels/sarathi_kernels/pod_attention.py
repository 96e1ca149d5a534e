"""Prefill and decode attention of a hybrid batch co-scheduled in one persistent launch (POD-Attention's
idea, in Triton): ``num_sms x ctas_per_sm`` programs, each claiming one of the lanes (work lists)
pod_plan.py made for the SM it runs on, and running its prefill q-tiles and decode items through one of
two tile shapes of the same kernel. Since the plan starts a prefill lane and a decode lane on each SM,
the decodes' KV reads overlap the chunk's matmuls there instead of running before or after them.

The paged KV layout, the block tables and the metadata are paged_attention.py's, and so is the walk
over one key tile (``_attend_kv_tile``). Each item walks its whole context (no split): the plan has a
program per resident CTA and spreads the items over them, so no SM idles for want of programs. The work
lists sit in buffers of a fixed capacity (``PodWork``), so a CUDA graph can replay the grid after the
host copies a new batch's plan into them.
"""
from __future__ import annotations

import math

import torch
import triton.language as tl

from sarathi_kernels._checks import padded_head_dim, require
from sarathi_kernels.attention_plan import plan_launch
from sarathi_kernels.attention_tile import _LOG2E, _dot_dtype, _walk_keys
from sarathi_kernels.occupancy import device_sm_count
from sarathi_kernels.pod_plan import (
    CTAS_PER_SM,
    FLOPS_PER_BYTE,
    INTERPRETER_SMS,
    ITEM_FIELDS,
    PodPlan,
    PodTiles,
    cached_plan,
)
from sarathi_kernels.triton_jit import INTERPRETED, jit

# How a program finds its lane: _claim_lane says each way.
SM_OF = ("program", "smid", "zero")


@jit
def _attend_tile(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, query_start_loc_ptr, seq_lens_ptr, block_tables_ptr,
                 req, first_q, kv_head, head_dim, scale_log2, stride_qt, stride_qh, stride_ot, stride_oh,
                 stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
                 BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    """Rows ``first_q:first_q + BLOCK_M // GROUP_PAD`` of request ``req`` for the query heads of
    ``kv_head``: paged_attention's program body, unsplit."""
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP_PAD
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

    # Bottom-right causal, as in paged_attention: the first masked key tile starts at or before the
    # tile's first row's position, so no row meets an all-masked first tile.
    row_limit = prefix + tok
    kv_end = tl.minimum(seq_len, prefix + first_q + BLOCK_Q)
    full_end = ((prefix + first_q + 1) // BLOCK_N) * BLOCK_N
    table_ptr = block_tables_ptr + req.to(tl.int64) * stride_bt
    k_ptr = k_cache_ptr + kv_head * stride_kh
    v_ptr = v_cache_ptr + kv_head * stride_vh
    acc, _m, l_i = _walk_keys(q, 0, kv_end, full_end, kv_end, row_limit, table_ptr, k_ptr, v_ptr, stride_kb,
                              stride_ks, stride_vb, stride_vs, offs_d, d_ok, scale_log2, BLOCK_M, HEAD_DIM_PAD,
                              BLOCK_SIZE, BLOCK_N, DOT_DTYPE, PRECISION)
    # A padded request of context 0 saw no key: l == 0, and its output is 0, not 0/0.
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_rows = (q_start + tok).to(tl.int64) * stride_ot + head * stride_oh
    tl.store(out_ptr + o_rows[:, None] + offs_d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])


@jit
def _sm_id():
    # The SM this program runs on (PTX's %smid: not necessarily contiguous, hence the caller's modulo).
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@jit
def _claim_lane(claims_ptr, program, num_sms, CTAS_PER_SM: tl.constexpr, SM_OF: tl.constexpr):
    """The lane (a planned work list) this program runs. By ``SM_OF``: "program": lane = program id, the
    breadth-first placement a resident 1-D grid gets; "smid": a free lane of the SM the program landed
    on, claimed by compare-and-swap, else any free lane, so that whatever the hardware's placement each
    SM runs the lanes planned for it and every lane runs once; "zero": as "smid" with every program on
    SM 0 (the interpreter's test of the fallback)."""
    if SM_OF == "program":
        lane = program
    else:
        if SM_OF == "smid":
            sm = _sm_id() % num_sms
        else:
            sm = program * 0
        lane = program * 0 - 1
        j = 0
        while (lane < 0) & (j < CTAS_PER_SM):
            mine = sm + j * num_sms
            lane = tl.where(tl.atomic_cas(claims_ptr + mine, 0, 1) == 0, mine, lane)
            j += 1
        any_lane = 0
        while lane < 0:
            lane = tl.where(tl.atomic_cas(claims_ptr + any_lane, 0, 1) == 0, any_lane, lane)
            any_lane += 1
    return lane


@jit
def _release_lanes(claims_ptr, programs, SM_OF: tl.constexpr):
    """The last program to finish zeroes the claims for the next launch (a graph replays it as well);
    it is last only once every program has claimed its lane, so no claim is lost."""
    if SM_OF != "program":
        finished = tl.atomic_add(claims_ptr + programs, 1)
        if finished == programs - 1:
            for start in range(0, programs + 1, 128):
                offs = start + tl.arange(0, 128)
                tl.store(claims_ptr + offs, tl.zeros([128], tl.int32), mask=offs <= programs)


@jit(do_not_specialize=("stride_bt", "num_sms"))
def _pod_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, query_start_loc_ptr, seq_lens_ptr, block_tables_ptr,
    work_indptr_ptr, items_ptr, claims_ptr, num_sms, head_dim, scale_log2,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
    BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    PREFILL_M: tl.constexpr, DECODE_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr, ITEM_FIELDS: tl.constexpr, CTAS_PER_SM: tl.constexpr, SM_OF: tl.constexpr,
):
    lane = _claim_lane(claims_ptr, tl.program_id(0), num_sms, CTAS_PER_SM, SM_OF)
    first = tl.load(work_indptr_ptr + lane)
    last = tl.load(work_indptr_ptr + lane + 1)
    for w in range(first, last):
        item = items_ptr + w * ITEM_FIELDS
        kind = tl.load(item)
        req = tl.load(item + 1)
        first_q = tl.load(item + 2)
        kv_head = tl.load(item + 3)
        if kind == 0:
            _attend_tile(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, query_start_loc_ptr, seq_lens_ptr, block_tables_ptr,
                         req, first_q, kv_head, head_dim, scale_log2, stride_qt, stride_qh, stride_ot, stride_oh,
                         stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
                         BLOCK_SIZE, GROUP, GROUP_PAD, HEAD_DIM_PAD, PREFILL_M, BLOCK_N, DOT_DTYPE, PRECISION)
        else:
            _attend_tile(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, query_start_loc_ptr, seq_lens_ptr, block_tables_ptr,
                         req, first_q, kv_head, head_dim, scale_log2, stride_qt, stride_qh, stride_ot, stride_oh,
                         stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
                         BLOCK_SIZE, GROUP, GROUP_PAD, HEAD_DIM_PAD, DECODE_M, BLOCK_N, DOT_DTYPE, PRECISION)
    _release_lanes(claims_ptr, num_sms * CTAS_PER_SM, SM_OF)


def pod_tiles(num_heads: int, num_kv_heads: int, head_dim: int, element_size: int, *, prefill_m: int | None = None,
              decode_m: int | None = None, block_n: int | None = None) -> tuple[PodTiles, int]:
    """The two tile shapes and the warps of the fused launch: the sequential kernel's prefill and decode
    tiles (attention_plan.py decides them), warps for the larger."""
    prefill = plan_launch(1, 1, num_heads, num_kv_heads, max_seq_len=1, element_size=element_size,
                          block_m=prefill_m, block_n=block_n)
    decode = plan_launch(1, 1, num_heads, num_kv_heads, max_seq_len=1, element_size=element_size, max_query_len=1,
                         block_m=decode_m, block_n=prefill.block_n)
    tiles = PodTiles(prefill.group, prefill.group_pad, prefill.block_m, decode.block_m, prefill.block_n, head_dim,
                     element_size)
    return tiles, max(prefill.num_warps, decode.num_warps)


class PodWork:
    """The plan's device buffers, of a fixed capacity so that their addresses outlive any one batch:
    ``work_indptr`` int32 [programs + 1], ``items`` int32 [capacity, ITEM_FIELDS], and ``claims`` int32
    [programs + 1]: which lanes programs have taken, and how many programs have finished (zero between
    launches: the kernel's last program leaves them so)."""

    def __init__(self, programs: int, capacity: int, device: torch.device):
        self.programs, self.capacity = programs, capacity
        self.work_indptr = torch.zeros(programs + 1, dtype=torch.int32, device=device)
        self.items = torch.zeros(max(capacity, 1), ITEM_FIELDS, dtype=torch.int32, device=device)
        self.claims = torch.zeros(programs + 1, dtype=torch.int32, device=device)

    def load(self, plan: PodPlan) -> None:
        """Copy ``plan`` in (host to device, no sync): a graph captured over these buffers replays it."""
        require(plan.programs == self.programs,
                f"plan has {plan.programs} programs, the buffers were made for {self.programs}")
        require(len(plan.items) <= self.capacity,
                f"plan has {len(plan.items)} work items, the buffers hold {self.capacity}")
        # From the plan's own arrays (no per-item conversion); a host copy in flight keeps its source
        # alive, and the cached plan outlives the copy.
        self.work_indptr.copy_(torch.from_numpy(plan.indptr_array), non_blocking=True)
        if plan.items:
            self.items[: len(plan.items)].copy_(torch.from_numpy(plan.items_array), non_blocking=True)


def plan_batch(query_lens: list[int], seq_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
               element_size: int, device: torch.device, *, num_sms: int | None = None, ctas_per_sm: int = CTAS_PER_SM,
               flops_per_byte: float = FLOPS_PER_BYTE, prefill_m: int | None = None, decode_m: int | None = None,
               block_n: int | None = None) -> tuple[PodPlan, int]:
    """A batch's plan (``cached_plan``: planned once per length signature) and the launch's warps;
    ``num_sms`` defaults to the device's (the interpreter: a few)."""
    tiles, num_warps = pod_tiles(num_heads, num_kv_heads, head_dim, element_size, prefill_m=prefill_m,
                                 decode_m=decode_m, block_n=block_n)
    sms = num_sms or device_sm_count(device) or INTERPRETER_SMS
    return cached_plan(query_lens, seq_lens, num_kv_heads, tiles, num_sms=sms, ctas_per_sm=ctas_per_sm,
                       flops_per_byte=flops_per_byte), num_warps


def pod_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                  plan: PodPlan, work: PodWork, scale: float | None = None, *, out: torch.Tensor | None = None,
                  num_warps: int = 4, num_stages: int | None = None, sm_of: str | None = None) -> torch.Tensor:
    """Causal attention of a hybrid batch over its paged KV cache (paged_attention's arguments and
    layout) in one persistent launch of ``plan.programs`` programs, whose work lists ``work`` holds
    (``work.load(plan)`` first; the buffers, not ``plan``, are what the kernel reads). ``plan`` gives
    the tile shapes; its lengths must be the batch's, which are trusted (no device sync). ``sm_of``:
    how a program finds its lane (``_claim_lane``); default "smid" compiled, "program" interpreted."""
    num_heads, head_dim = query.shape[1:]
    tiles = plan.tiles
    require(k_cache.shape[2] * tiles.group == num_heads and tiles.head_dim == head_dim,
            f"the plan is for {tiles.group} query heads per KV head of {tiles.head_dim}, the batch has "
            f"{num_heads} query heads over {k_cache.shape[2]} KV heads of {head_dim}")
    require(work.programs == plan.programs, f"work buffers for {work.programs} programs, plan for {plan.programs}")
    sm_of = sm_of or ("program" if INTERPRETED else "smid")
    require(sm_of in SM_OF, f"sm_of must be one of {', '.join(SM_OF)}, got {sm_of!r}")
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if query.shape[0] == 0:
        return out
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    options = {"num_warps": num_warps} | ({"num_stages": num_stages} if num_stages is not None else {})
    _pod_attention_kernel[(plan.programs,)](
        query, k_cache, v_cache, out, query_start_loc, seq_lens, block_tables, work.work_indptr, work.items,
        work.claims, plan.num_sms, head_dim, scale * _LOG2E,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        BLOCK_SIZE=k_cache.shape[1], GROUP=tiles.group, GROUP_PAD=tiles.group_pad,
        HEAD_DIM_PAD=padded_head_dim(head_dim), PREFILL_M=tiles.prefill_m, DECODE_M=tiles.decode_m,
        BLOCK_N=tiles.block_n, DOT_DTYPE=_dot_dtype(query.dtype),
        # fp32 must stay fp32: the default tf32 dot would miss the reference by ~1e-3.
        PRECISION="ieee" if query.dtype == torch.float32 else None, ITEM_FIELDS=ITEM_FIELDS,
        CTAS_PER_SM=plan.ctas_per_sm, SM_OF=sm_of, **options,
    )
    return out
