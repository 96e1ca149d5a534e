"""Which program of a persistent grid computes which piece of a hybrid batch's attention, decided on the
host from the batch's lengths (no device sync, no Triton), as FlashInfer's plan/run splits the work.

Why: a Sarathi hybrid batch is a compute-bound prefill chunk beside memory-bound decodes. Run one after
the other (or as one grid whose programs the hardware places in order), an SM is busy with either
tensor-core work or waiting on HBM at a time. POD-Attention (Kamath et al., ASPLOS'25) places prefill
and decode work on the same SM at the same time, so that the decodes' KV reads hide under the chunk's
matmuls. Here the grid is persistent: ``num_sms x ctas_per_sm`` programs, all resident at once; SM
``s`` has the lanes (work lists) ``s, s + num_sms, ...``, and each program claims a lane of the SM it
finds itself on (pod_attention.py), as POD-Attention's CTAs pick their role from their SM. This plan

1. splits the batch into work items: a prefill tile (a q-tile of one request's chunk for one KV head)
   or a decode item (one decode's token for one KV head), each with an estimated cost: a prefill
   tile's flops over the machine's flops per byte, a decode item's KV bytes;
2. places prefill tiles longest first on the SM with the least compute so far (LPT), then decode items
   on the SM whose busier resource is the least loaded, so decodes fill in where the chunk is light;
3. gives each SM's lanes a kind in proportion to its two loads (both kinds present: at least one lane
   each), and spreads each kind's items over its lanes longest first.

The result is a CSR list (``work_indptr``: program p runs items ``work_indptr[p]:work_indptr[p + 1]``)
that the kernel reads from fixed-size buffers, so that a CUDA graph can replay one grid over any plan
copied into them.

A replay must not wait on this Python placement (a heap step per item): ``cached_plan`` keeps plans by
the batch's length signature, each context counted in groups of key tiles. Any assignment of the items computes
the same outputs (every item writes its own rows, unsplit), so a plan made for one batch of a
signature is right for every other; only its balance is the first batch's.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

PREFILL, DECODE = 0, 1
# Fields of one work item, as the kernel reads them (int32, row-major [items, ITEM_FIELDS]).
ITEM_FIELDS = 4  # kind, request, first query token of the tile, KV head
# Resident programs per SM: the fused kernel is sized by its larger (prefill) path, whose registers and
# shared memory fit two CTAs on a Hopper SM (a test holds the compiled kernel to it).
CTAS_PER_SM = 2
# The share of the tensor cores' matmul rate an attention tile reaches: its softmax, masking and
# rescaling run on the CUDA cores between its two dots.
ATTENTION_MATMUL_SHARE = 0.5
# Flops a prefill tile does in the time a decode reads one byte, on the same SM: H100/H200's bf16
# tensor-core peak over their HBM bandwidth is about 300 flop/byte on their datasheets, at the share
# above. The benchmark passes its measured ceilings' ratio instead (``flops_per_byte``).
FLOPS_PER_BYTE = 300.0 * ATTENTION_MATMUL_SHARE
# Programs of the interpreter's grid (no SMs to count): enough lanes for both kinds to meet in one program list.
INTERPRETER_SMS = 2


@dataclass(frozen=True)
class PodTiles:
    """The two tile shapes of one fused launch (rows are tokens x padded GQA group, as in paged_attention)."""

    group: int
    group_pad: int
    prefill_m: int
    decode_m: int
    block_n: int
    head_dim: int
    element_size: int

    @property
    def prefill_q(self) -> int:
        return self.prefill_m // self.group_pad


@dataclass(frozen=True)
class PodPlan:
    tiles: PodTiles
    num_sms: int
    ctas_per_sm: int
    items: list[tuple[int, int, int, int]]  # (kind, request, first query token, KV head), program by program
    work_indptr: list[int]  # [programs + 1]
    compute: list[float]  # per SM: its prefill tiles' flops / flops_per_byte
    memory: list[float]  # per SM: its decode items' KV bytes
    # The same lists as int32 arrays, made once, which the work buffers copy from on each replay.
    items_array: np.ndarray = field(init=False, repr=False, compare=False)
    indptr_array: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        items = np.asarray(self.items, dtype=np.int32).reshape(-1, ITEM_FIELDS)
        object.__setattr__(self, "items_array", items)
        object.__setattr__(self, "indptr_array", np.asarray(self.work_indptr, dtype=np.int32))

    @property
    def programs(self) -> int:
        return self.num_sms * self.ctas_per_sm

    def program_items(self, program: int) -> list[tuple[int, int, int, int]]:
        return self.items[self.work_indptr[program]: self.work_indptr[program + 1]]

    @property
    def overlapped_cost(self) -> float:
        """The busiest SM's max(compute, memory): the plan's time if each SM overlaps its two kinds fully."""
        return max((max(c, m) for c, m in zip(self.compute, self.memory)), default=0.0)

    @property
    def sequential_cost(self) -> float:
        """The same work with the kinds one after the other, each spread evenly over every SM."""
        n = max(len(self.compute), 1)
        return sum(self.compute) / n + sum(self.memory) / n


def flops_per_byte_of(matmul_gflops: float, copy_gbps: float) -> float:
    """The plan's exchange rate between a prefill tile's flops and a decode's bytes, from a device's
    measured ceilings (GEMM rate, copy bandwidth)."""
    return ATTENTION_MATMUL_SHARE * matmul_gflops / copy_gbps


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def item_capacity(num_tokens: int, num_requests: int, num_kv_heads: int, tiles: PodTiles) -> int:
    """The most work items a batch of ``num_tokens`` query tokens in ``num_requests`` requests can have,
    whatever its lengths: what a CUDA graph sizes its plan buffers for at capture. Each request has
    ceil(q_len / prefill_q) tiles (a decode one item) per KV head, at most T // prefill_q + R in all."""
    return (num_tokens // tiles.prefill_q + num_requests) * num_kv_heads


def pod_items(query_lens: list[int], seq_lens: list[int], num_kv_heads: int, tiles: PodTiles,
              flops_per_byte: float) -> list[tuple[float, tuple[int, int, int, int]]]:
    """Every work item of the batch with its cost in bytes: a request of one query token is a decode
    item per KV head, a longer one prefill tiles of ``tiles.prefill_q`` tokens per KV head."""
    out = []
    d = tiles.head_dim
    for req, (q_len, ctx) in enumerate(zip(query_lens, seq_lens)):
        if q_len == 1:
            cost = 2.0 * ctx * d * tiles.element_size  # its keys and values, read once
            out += [(cost, (DECODE, req, 0, h)) for h in range(num_kv_heads)]
            continue
        prefix = ctx - q_len
        for first in range(0, q_len, tiles.prefill_q):
            # Every row of a tile walks the keys up to its last row's (masked ones too): QK^T and PV.
            keys = cdiv(min(ctx, prefix + first + tiles.prefill_q), tiles.block_n) * tiles.block_n
            cost = 4.0 * tiles.prefill_m * keys * d / flops_per_byte
            out += [(cost, (PREFILL, req, first, h)) for h in range(num_kv_heads)]
    return out


def plan_pod(query_lens: list[int], seq_lens: list[int], num_kv_heads: int, tiles: PodTiles, *, num_sms: int,
             ctas_per_sm: int = CTAS_PER_SM, flops_per_byte: float = FLOPS_PER_BYTE) -> PodPlan:
    """The persistent grid's work lists for a batch (lengths per request, any order of prefills and
    decodes; a padded request of context 0 is a decode item that writes zeros)."""
    if num_sms < 1 or ctas_per_sm < 1:
        raise ValueError(f"num_sms and ctas_per_sm must be >= 1, got {num_sms} and {ctas_per_sm}")
    if flops_per_byte <= 0:
        raise ValueError(f"flops_per_byte must be > 0, got {flops_per_byte}")
    work = pod_items(query_lens, seq_lens, num_kv_heads, tiles, flops_per_byte)
    # Longest first; ties in batch order so that the plan of a batch is always the same.
    order = sorted(range(len(work)), key=lambda i: -work[i][0])
    compute, memory = [0.0] * num_sms, [0.0] * num_sms
    per_sm: list[list[int]] = [[] for _ in range(num_sms)]
    heap = [(0.0, s) for s in range(num_sms)]
    for i in order:
        if work[i][1][0] == PREFILL:
            _, s = heapq.heappop(heap)
            compute[s] += work[i][0]
            per_sm[s].append(i)
            heapq.heappush(heap, (compute[s], s))
    heap = [(max(compute[s], memory[s]), s) for s in range(num_sms)]
    heapq.heapify(heap)
    for i in order:
        if work[i][1][0] == DECODE:
            _, s = heapq.heappop(heap)
            memory[s] += work[i][0]
            per_sm[s].append(i)
            heapq.heappush(heap, (max(compute[s], memory[s]), s))
    lanes: list[list[int]] = [[] for _ in range(num_sms * ctas_per_sm)]
    for s in range(num_sms):
        _fill_lanes(s, per_sm[s], work, compute[s], memory[s], num_sms, ctas_per_sm, lanes)
    items, indptr = [], [0]
    for lane in lanes:
        items += [work[i][1] for i in lane]
        indptr.append(len(items))
    return PodPlan(tiles, num_sms, ctas_per_sm, items, indptr, compute, memory)


def _fill_lanes(sm: int, chosen: list[int], work, compute: float, memory: float, num_sms: int, ctas_per_sm: int,
                lanes: list[list[int]]) -> None:
    """One SM's items over its lanes. Each lane has a primary kind, lanes of each kind in proportion to
    the kind's load (at least one each when both are present): a prefill lane and a decode lane start
    side by side, each on its kind's items longest first. Then the lanes are evened out: the last item
    of the busiest lane moves to the end of the idlest while that shortens the busiest, so that when
    one kind runs out (the chunk's tiles, say, long before the decodes' KV reads end) its lanes take
    the other kind's tail instead of leaving the SM one program to hide memory latency with."""
    kinds = {PREFILL: [i for i in chosen if work[i][1][0] == PREFILL],
             DECODE: [i for i in chosen if work[i][1][0] == DECODE]}
    mine = [sm + j * num_sms for j in range(ctas_per_sm)]
    if not kinds[DECODE] or not kinds[PREFILL] or ctas_per_sm == 1:
        primary = {PREFILL: mine, DECODE: mine}
    else:
        n_decode = min(max(round(ctas_per_sm * memory / (compute + memory)), 1), ctas_per_sm - 1)
        primary = {PREFILL: mine[: ctas_per_sm - n_decode], DECODE: mine[ctas_per_sm - n_decode:]}
    load = dict.fromkeys(mine, 0.0)
    for kind in (PREFILL, DECODE):
        heap = [(load[p], p) for p in primary[kind]]
        heapq.heapify(heap)
        for i in kinds[kind]:
            _, p = heapq.heappop(heap)
            lanes[p].append(i)
            load[p] += work[i][0]
            heapq.heappush(heap, (load[p], p))
    while True:
        busiest, idlest = max(mine, key=load.get), min(mine, key=load.get)
        if len(lanes[busiest]) < 2:
            return
        moved = work[lanes[busiest][-1]][0]
        if load[idlest] + moved >= load[busiest]:
            return
        lanes[idlest].append(lanes[busiest].pop())
        load[busiest] -= moved
        load[idlest] += moved


# Plans kept by signature (``cached_plan``); past this many the oldest goes.
MAX_CACHED_PLANS = 512
_PLANS: OrderedDict[tuple, PodPlan] = OrderedDict()


# Contexts are told apart by this many key tiles: a decode's grows a token an iteration, and a plan
# balanced for one context balances its neighbours about as well.
SIGNATURE_KEY_TILES = 4


def signature(query_lens: list[int], seq_lens: list[int], block_n: int) -> tuple[bytes, bytes]:
    """What makes two batches' plans interchangeable in balance: their query lengths (the items) and
    their contexts in units of SIGNATURE_KEY_TILES key tiles (the items' costs)."""
    unit = SIGNATURE_KEY_TILES * block_n
    return (np.asarray(query_lens, dtype=np.int32).tobytes(),
            (-(-np.asarray(seq_lens, dtype=np.int64) // unit)).tobytes())


def cached_plan(query_lens: list[int], seq_lens: list[int], num_kv_heads: int, tiles: PodTiles, *, num_sms: int,
                ctas_per_sm: int = CTAS_PER_SM, flops_per_byte: float = FLOPS_PER_BYTE) -> PodPlan:
    """``plan_pod``'s plan, made once per length signature and GPU: a batch of a signature met before
    gets that plan with no per-item work."""
    key = (signature(query_lens, seq_lens, tiles.block_n), num_kv_heads, tiles, num_sms, ctas_per_sm,
           flops_per_byte)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = plan_pod(query_lens, seq_lens, num_kv_heads, tiles, num_sms=num_sms,
                                      ctas_per_sm=ctas_per_sm, flops_per_byte=flops_per_byte)
        if len(_PLANS) > MAX_CACHED_PLANS:
            _PLANS.popitem(last=False)
    else:
        _PLANS.move_to_end(key)
    return plan
