"""One hybrid batch's attention (a chunk beside decodes) timed every way ``hybrid_grid`` names,
beside its floor and its sequential floor (the chunk's plus the decodes'). Each contender is first
held to attention/reference.py; timing is attention_peers'."""
from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from sarathi_lab.measure.profiling import attention_peers as peers
from sarathi_lab.measure.profiling import hybrid_grid as grid
from sarathi_lab.measure.profiling.attention import context_slot_mapping, paged_batch, paged_cache
from sarathi_lab.measure.profiling.attention_grid import FLEX, SDPA, Case
from sarathi_lab.model.floors import attention_floor


def make_inputs(case: grid.HybridCase, dtype: torch.dtype, device: torch.device,
                block_size: int) -> tuple[peers.Inputs, peers.Inputs]:
    """The whole batch (the chunk first; q, k, v: the decodes' in SDPA's layout), the chunk."""
    gen = torch.Generator(device).manual_seed(0)
    h, kvh, d = case.heads, case.kv_heads, case.head_dim
    c, b, ctx = case.chunk, case.decodes, case.context
    query = torch.randn(c + b, h, d, generator=gen, device=device).to(dtype)
    k, v = (torch.randn(b + 1, ctx, kvh, d, generator=gen, device=device).to(dtype)
            for _ in range(2))
    meta, num_blocks = paged_batch(case.query_lens, case.context_lens, num_prefills=1,
                                   block_size=block_size, device=device)
    slots = context_slot_mapping(meta, block_size)
    k_cache, v_cache = (paged_cache(x.flatten(0, 1), slots, num_blocks, block_size) for x in (k, v))
    # [requests, kv_heads, ctx, d]
    k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    chunk = peers.Inputs(query[:c], k_cache, v_cache, meta,
                         query[:c].transpose(0, 1)[None].contiguous(), k[:1], v[:1], d ** -0.5)
    return peers.Inputs(query, k_cache, v_cache, meta, query[c:, :, None].contiguous(), k[1:],
                        v[1:], d ** -0.5), chunk


def pod_call(x: peers.Inputs, ctas_per_sm: int, flops_per_byte: float,
             sm_of: str | None = None) -> tuple[Callable[[], torch.Tensor], float]:
    """The plan made beforehand (once an iteration in the engine), and its host ms."""
    from sarathi_kernels.pod_attention import PodWork, plan_batch, pod_attention

    m = x.meta
    started = time.perf_counter()
    plan, warps = plan_batch(m.query_lens_host, m.seq_lens_host, x.query.shape[1],
                             x.k_cache.shape[2], x.query.shape[2], x.query.element_size(),
                             x.query.device, ctas_per_sm=ctas_per_sm, flops_per_byte=flops_per_byte)
    plan_ms = (time.perf_counter() - started) * 1e3
    work = PodWork(plan.programs, len(plan.items), x.query.device)
    work.load(plan)
    out = torch.empty_like(x.query)
    return (lambda: pod_attention(x.query, x.k_cache, x.v_cache, m.query_start_loc, m.seq_lens,
                                  m.block_tables, plan, work, x.scale, out=out, num_warps=warps,
                                  sm_of=sm_of)), plan_ms


def two_launches_call(x: peers.Inputs) -> Callable[[], torch.Tensor]:
    from sarathi_kernels.paged_attention import paged_attention

    m, out = x.meta, torch.empty_like(x.query)
    c = m.num_prefill_tokens
    chunk = (x.query[:c], x.k_cache, x.v_cache, m.query_start_loc[:2], m.seq_lens[:1],
             m.block_tables[:1])
    decodes = (x.query[c:], x.k_cache, x.v_cache, m.query_start_loc[1:] - c, m.seq_lens[1:],
               m.block_tables[1:])

    def call() -> torch.Tensor:
        paged_attention(*chunk, x.scale, max_query_len=c, out=out[:c])
        paged_attention(*decodes, x.scale, max_query_len=1, out=out[c:])
        return out
    return call


def peer_call(name: str, case: grid.HybridCase, x: peers.Inputs, chunk: peers.Inputs, flash: bool,
              flex: peers.Flex | None) -> Callable[[], torch.Tensor]:
    """A peer's chunk, then SDPA's decodes, as engine rows."""
    chunk_case = Case("chunk", case.heads, case.kv_heads, case.head_dim, case.chunk, case.context)
    if name == FLEX:
        chunk_fn = flex.call(chunk_case, chunk)
    else:
        chunk_fn = peers.sdpa_call(chunk_case, chunk, SDPBackend.FLASH_ATTENTION if flash else None)
    gqa = x.q.shape[1] != x.k.shape[1]

    def decodes() -> torch.Tensor:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION) if flash else nullcontext():
            return F.scaled_dot_product_attention(x.q, x.k, x.v, scale=x.scale,
                                                  enable_gqa=gqa)[:, :, 0]
    return lambda: torch.cat([chunk_fn()[0].transpose(0, 1), decodes()])


def measure(case: grid.HybridCase, *, dtype: torch.dtype, device: torch.device, block_size: int,
            reps: int, warmup: int, flex: peers.Flex | None, copy_gbps: float,
            matmul_gflops: float) -> dict:
    """Each contender's median ms (None and ``<name>_error`` where not), floors, ratios."""
    from sarathi_kernels.pod_plan import CTAS_PER_SM, flops_per_byte_of

    x, chunk = make_inputs(case, dtype, device, block_size)
    flash = device.type == "cuda"
    rate = flops_per_byte_of(matmul_gflops, copy_gbps)
    row: dict = {"shape": case.label, "heads": case.heads, "kv_heads": case.kv_heads,
                 "head_dim": case.head_dim, "chunk": case.chunk, "decodes": case.decodes,
                 "context": case.context, "dtype": str(dtype).removeprefix("torch."),
                 "device": device.type, "ctas_per_sm": CTAS_PER_SM, "flops_per_byte": rate}
    builders: dict[str, Callable[[], Callable[[], torch.Tensor]]] = {
        grid.ONE_LAUNCH: lambda: peers.engine_call(x),
        grid.TWO_LAUNCHES: lambda: two_launches_call(x),
        SDPA: lambda: peer_call(SDPA, case, x, chunk, flash, flex)}
    # None: pod_attention's own choice
    pods = ((grid.POD, CTAS_PER_SM, None), (grid.POD_BY_PROGRAM, CTAS_PER_SM, "program"),
            (grid.POD_X1, 1, None))
    for name, lanes, sm_of in pods:
        def build(lanes=lanes, name=name, sm_of=sm_of):
            fn, row[f"{name}_plan_ms"] = pod_call(x, lanes, rate, sm_of)
            return fn
        builders[name] = build
    if flex is not None:
        builders[FLEX] = lambda: peer_call(FLEX, case, x, chunk, flash, flex)
    peers.time_checked(builders, grid.CONTENDERS, x, row, device, reps, warmup)
    row |= floors(case, dtype.itemsize, copy_gbps, matmul_gflops)
    row |= ratios(row)
    return row


def floors(case: grid.HybridCase, elem_bytes: int, copy_gbps: float, matmul_gflops: float) -> dict:
    """What co-scheduling can win at most is their difference."""
    def least(query_lens, context_lens):
        return attention_floor(case.heads, case.kv_heads, case.head_dim, query_lens, context_lens,
                               elem_bytes, copy_gbps, matmul_gflops)

    whole = least(case.query_lens, case.context_lens)
    chunk = least(case.query_lens[:1], case.context_lens[:1])
    decodes = least(case.query_lens[1:], case.context_lens[1:])
    return {"floor_ms": whole.seconds * 1e3, "floor_bound": whole.bound,
            "sequential_floor_ms": (chunk.seconds + decodes.seconds) * 1e3,
            "chunk_floor_ms": chunk.seconds * 1e3, "decodes_floor_ms": decodes.seconds * 1e3}


def ratios(row: dict) -> dict:
    """The control (one lane an SM) over the sequential way too."""
    sequential, peer = (min((row[f"{n}_ms"] for n in names if row.get(f"{n}_ms") is not None),
                            default=None) for names in (grid.SEQUENTIAL, grid.PEERS))
    pod, control = row.get(f"{grid.POD}_ms"), row.get(f"{grid.POD_X1}_ms")

    def over(a, b):
        return a / b if a is not None and b else None

    return {"sequential_ms": sequential, "best_peer_ms": peer,
            "over_sequential": over(pod, sequential),
            "control_over_sequential": over(control, sequential), "over_best_peer": over(pod, peer),
            "over_floor": over(pod, row["floor_ms"]),
            "floor_over_sequential_floor": over(row["floor_ms"], row["sequential_floor_ms"]),
            "max_rel_diff": max((row[k] for k in row if k.endswith("_rel_diff")), default=None)}
