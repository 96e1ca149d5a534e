"""The co-scheduled hybrid attention (pod_plan.py, pod_attention.py): equal to attention/reference.py
and to the sequential paged kernel in Triton's interpreter over chunks, prefixes, decodes, MHA/GQA,
cache blocks, key tiles, grids and padded requests; its plan covers every tile once and puts prefill
and decode work side by side on each SM; it compiles for Hopper without spills."""
from __future__ import annotations

import json

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sarathi_kernels.paged_attention import paged_attention
from sarathi_kernels.pod_attention import PodWork, plan_batch, pod_attention, pod_tiles
from sarathi_kernels.pod_plan import CTAS_PER_SM, DECODE, PREFILL, cdiv, item_capacity, plan_pod

from sarathi_lab.tuned_kernels import TunedTable, using
from tests.test_kernel_splits import with_padding_rows
from tests.test_kernels import assert_close, expected, make_inputs
from tests.triton_compile import compile_for_gpu


def always(*groups: int) -> TunedTable:
    """A table whose measurements co-schedule every hybrid batch of these GQA groups."""
    return TunedTable(co_schedule=[{"heads": 4 * g, "kv_heads": 4, "chunk": 64, "decodes": 4, "context": 512,
                                    "over_sequential": 0.5} for g in groups])


def run_pod(query, k_cache, v_cache, starts, seq_lens, tables, *, num_sms, ctas_per_sm=2, sm_of=None, work=None,
            **tiles):
    query_lens = (starts[1:] - starts[:-1]).tolist()
    plan, warps = plan_batch(query_lens, seq_lens.tolist(), query.shape[1], k_cache.shape[2], query.shape[2],
                             query.element_size(), query.device, num_sms=num_sms, ctas_per_sm=ctas_per_sm, **tiles)
    # Buffers larger than the plan, as a graph's are: items past its lists must never be read.
    if work is None:
        work = PodWork(plan.programs, len(plan.items) + 7, query.device)
        work.items.fill_(-1)
    work.load(plan)
    out = torch.full_like(query, float("nan"))
    return pod_attention(query, k_cache, v_cache, starts, seq_lens, tables, plan, work, query.shape[-1] ** -0.5,
                         out=out, num_warps=warps, sm_of=sm_of)


@settings(max_examples=12, deadline=None)
@given(chunks=st.lists(st.tuples(st.integers(2, 40), st.integers(0, 120)), min_size=0, max_size=2),
       decodes=st.lists(st.integers(1, 130), max_size=4),
       heads=st.sampled_from([(2, 2), (4, 1), (4, 2), (6, 2)]), block_size=st.sampled_from([16, 32]),
       block_n=st.sampled_from([16, 32]), num_sms=st.integers(1, 4), ctas_per_sm=st.integers(1, 3),
       pad=st.integers(0, 2), seed=st.integers(0, 2**16))
# A chunk over a prefix beside decodes on a GQA group of 4; a lone prefill of one KV head on one lane.
@example(chunks=[(33, 100)], decodes=[1, 17, 64], heads=(4, 1), block_size=16, block_n=16, num_sms=2, ctas_per_sm=2,
         pad=2, seed=0)
@example(chunks=[(5, 0)], decodes=[], heads=(2, 2), block_size=32, block_n=16, num_sms=1, ctas_per_sm=1, pad=0,
         seed=1)
def test_pod_matches_reference(chunks, decodes, heads, block_size, block_n, num_sms, ctas_per_sm, pad, seed):
    if not chunks and not decodes:
        decodes = [3]
    torch.manual_seed(seed)
    num_heads, num_kv_heads = heads
    query, k_cache, v_cache, meta = make_inputs([(c, p + c) for c, p in chunks], [(1, n) for n in decodes],
                                                heads=num_heads, kv_heads=num_kv_heads, head_dim=16,
                                                block_size=block_size, dtype=torch.float32)
    ref = expected(query, k_cache, v_cache, meta)
    padded, starts, seq_lens, tables = with_padding_rows(query, meta, pad)
    out = run_pod(padded, k_cache, v_cache, starts, seq_lens, tables, num_sms=num_sms, ctas_per_sm=ctas_per_sm,
                  block_n=block_n)
    assert_close(out[: len(query)], ref, torch.float32)
    # Padded requests (context 0) see no key: zeros, as the sequential kernel gives them.
    assert torch.equal(out[len(query):], torch.zeros_like(out[len(query):]))


def test_pod_equals_the_sequential_kernels_on_the_same_batch():
    torch.manual_seed(3)
    query, k_cache, v_cache, meta = make_inputs([(48, 48), (20, 90)], [(1, 7), (1, 70), (1, 129)], heads=8,
                                                kv_heads=2, head_dim=32, block_size=16, dtype=torch.float16)
    args = (meta.query_start_loc, meta.seq_lens, meta.block_tables)
    pod = run_pod(query, k_cache, v_cache, *args, num_sms=3)
    sequential = paged_attention(query, k_cache, v_cache, *args, 32 ** -0.5, max_query_len=meta.max_query_len)
    assert_close(pod, expected(query, k_cache, v_cache, meta), torch.float16)
    assert (pod.float() - sequential.float()).abs().max().item() < 2e-3


@pytest.mark.parametrize("num_sms,ctas_per_sm", [(3, 2), (2, 3)])
def test_programs_that_land_on_one_sm_still_run_every_lane_once(num_sms, ctas_per_sm):
    # "zero": every program finds itself on SM 0, as a GPU that placed the grid unevenly would show
    # through %smid: the first take SM 0's lanes, the others any free lane; the last leaves the claims
    # zeroed, so the same buffers serve the next launch (a graph's replay).
    torch.manual_seed(5)
    query, k_cache, v_cache, meta = make_inputs([(40, 90)], [(1, 20), (1, 77), (1, 3)], heads=4, kv_heads=2,
                                                head_dim=16, block_size=16, dtype=torch.float32)
    args = (query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables)
    work = PodWork(num_sms * ctas_per_sm, 64, query.device)
    for _ in range(2):
        out = run_pod(*args, num_sms=num_sms, ctas_per_sm=ctas_per_sm, sm_of="zero", work=work)
        assert_close(out, expected(query, k_cache, v_cache, meta), torch.float32)
        assert not work.claims.any()


def test_pod_in_bfloat16():
    query, k_cache, v_cache, meta = make_inputs([(20, 60)], [(1, 40)], heads=4, kv_heads=2, head_dim=32,
                                                block_size=16, dtype=torch.bfloat16)
    out = run_pod(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables, num_sms=2)
    assert_close(out, expected(query, k_cache, v_cache, meta), torch.bfloat16)


def _tiles(heads=40, kv_heads=40):
    return pod_tiles(heads, kv_heads, 128, 2)[0]


@settings(max_examples=40, deadline=None)
@given(chunks=st.lists(st.tuples(st.integers(2, 600), st.integers(0, 3000)), max_size=2),
       decodes=st.lists(st.integers(1, 4000), max_size=40), heads=st.sampled_from([(40, 40), (32, 8), (8, 8)]),
       num_sms=st.integers(1, 140), ctas_per_sm=st.integers(1, 4))
def test_the_plan_covers_every_tile_once(chunks, decodes, heads, num_sms, ctas_per_sm):
    tiles = _tiles(*heads)
    query_lens = [c for c, _ in chunks] + [1] * len(decodes)
    seq_lens = [c + p for c, p in chunks] + decodes
    plan = plan_pod(query_lens, seq_lens, heads[1], tiles, num_sms=num_sms, ctas_per_sm=ctas_per_sm)
    wanted = {(PREFILL, r, q, h) for r, (c, _) in enumerate(chunks) for q in range(0, c, tiles.prefill_q)
              for h in range(heads[1])}
    wanted |= {(DECODE, len(chunks) + i, 0, h) for i in range(len(decodes)) for h in range(heads[1])}
    assert sorted(plan.items) == sorted(wanted)
    # What a graph's buffers hold for this many tokens and requests suffices whatever the lengths.
    assert len(plan.items) <= item_capacity(sum(query_lens), len(query_lens), heads[1], tiles)
    assert plan.work_indptr[0] == 0 and plan.work_indptr[-1] == len(plan.items)
    assert all(a <= b for a, b in zip(plan.work_indptr, plan.work_indptr[1:]))
    assert len(plan.work_indptr) == num_sms * ctas_per_sm + 1


def test_each_sm_starts_a_prefill_lane_beside_a_decode_lane():
    # LLaMA-13B, a 256-token chunk over a 768-token prefix beside 16 decodes at 1K, on 132 SMs of two
    # lanes: 160 prefill tiles and 640 decode items; every SM starts one of each kind side by side.
    tiles = _tiles()
    plan = plan_pod([256] + [1] * 16, [1024] * 17, 40, tiles, num_sms=132, ctas_per_sm=2)
    for sm in range(132):
        firsts = [plan.program_items(sm + j * 132)[0][0] for j in range(2)]
        assert sorted(firsts) == [PREFILL, DECODE], f"SM {sm} starts {firsts}"
    for p in range(plan.programs):
        # A lane's own kind longest first (the causal walk's longest tiles cannot trail), then the tail
        # it took over from the SM's other lane.
        items = plan.program_items(p)
        own = [q for kind, _, q, _ in items[: next((i for i, it in enumerate(items) if it[0] != items[0][0]),
                                                   len(items))]]
        assert own == sorted(own, reverse=True)
    # Loads balanced: the busiest SM within one longest item of the mean; overlapping beats queuing.
    longest = 2.0 * 1024 * 128 * 2
    assert max(map(max, plan.compute, plan.memory)) - sum(plan.memory) / 132 <= longest
    assert plan.overlapped_cost < plan.sequential_cost


def test_a_lane_whose_kind_runs_out_takes_the_other_s_tail():
    # Decodes far outweigh the chunk: the prefill lane, done early, takes decodes too.
    tiles = _tiles()
    plan = plan_pod([64] + [1] * 32, [64] + [3072] * 32, 40, tiles, num_sms=8, ctas_per_sm=2)
    for sm in range(8):
        kinds = [[kind for kind, *_ in plan.program_items(sm + j * 8)] for j in range(2)]
        prefill_lane = next(k for k in kinds if k[0] == PREFILL)
        assert DECODE in prefill_lane, kinds


def test_a_prefill_only_batch_uses_every_lane():
    tiles = _tiles()
    plan = plan_pod([512], [512], 40, tiles, num_sms=132, ctas_per_sm=2)
    busy = sum(plan.work_indptr[p + 1] > plan.work_indptr[p] for p in range(plan.programs))
    assert busy == min(plan.programs, cdiv(512, tiles.prefill_q) * 40)


def test_work_buffers_refuse_a_plan_they_cannot_hold():
    tiles = _tiles(4, 4)
    plan = plan_pod([1, 1, 1], [5, 6, 7], 4, tiles, num_sms=2)
    with pytest.raises(ValueError, match="plan has 12 work items, the buffers hold 11"):
        PodWork(plan.programs, 11, torch.device("cpu")).load(plan)
    with pytest.raises(ValueError, match="num_sms and ctas_per_sm must be >= 1, got 0 and 2"):
        plan_pod([1], [5], 4, tiles, num_sms=0)


# Compiled for Hopper (through ptxas) at LLaMA-13B's and Mistral-7B's head shapes, aligned as an engine
# launch is: ptxas's count of spilled registers of the fused kernel (both tile paths in one program).
_SPILLS = """
import json
import triton.language as tl
from sarathi_kernels.pod_attention import _pod_attention_kernel as pod

aligned = [n for n in pod.arg_names if n.endswith("_ptr") or n.startswith("stride") or n == "head_dim"]
types = dict(q_ptr="*bf16", k_cache_ptr="*bf16", v_cache_ptr="*bf16", out_ptr="*bf16", scale_log2="fp32")
found = {}
for group, sm_of in ((1, "smid"), (4, "smid"), (1, "program")):
    kernel = compile(pod, types, dict(BLOCK_SIZE=16, GROUP=group, GROUP_PAD=group, HEAD_DIM_PAD=128, PREFILL_M=64,
                                      DECODE_M=16, BLOCK_N=64, DOT_DTYPE=tl.bfloat16, PRECISION=None,
                                      ITEM_FIELDS=4, CTAS_PER_SM=2, SM_OF=sm_of),
                     arch=90, aligned=aligned, num_warps=4)
    found[f"pod group={group} {sm_of}"] = (*spill_bytes(kernel, 90), kernel.metadata.shared)
print(json.dumps(found))
"""
# An H100/H200 SM: 64K 32-bit registers, 228 KB of shared memory of which the system keeps 1 KB a CTA.
SM_REGISTERS, SM_SHARED, CTA_RESERVED_SHARED = 65536, 228 * 1024, 1024


@pytest.mark.slow
def test_pod_compiles_for_hopper_without_spills_and_its_lanes_fit_an_sm():
    done = compile_for_gpu(_SPILLS)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert {name: spilled for name, (_, spilled, _) in found.items() if spilled} == {}, found
    # The plan's lanes are programs resident side by side: CTAS_PER_SM of them must fit one SM.
    for name, (registers, _, shared) in found.items():
        assert CTAS_PER_SM * registers * 32 * 4 <= SM_REGISTERS, (name, registers)
        assert CTAS_PER_SM * (shared + CTA_RESERVED_SHARED) <= SM_SHARED, (name, shared)


def test_the_backend_co_schedules_hybrid_batches_only():
    from sarathi_lab.attention import make_backend

    query, k_cache, v_cache, meta = make_inputs([(20, 50)], [(1, 9), (1, 33)], heads=4, kv_heads=2, head_dim=16,
                                                block_size=16, dtype=torch.float32)
    backend = make_backend("triton", query.device, "pod")
    with using(always(2)):  # where a lease measured it faster (test_co_schedule.py: never elsewhere)
        out = backend.attend(query, k_cache, v_cache, meta, 16 ** -0.5)
    assert_close(out, expected(query, k_cache, v_cache, meta), torch.float32)
    assert meta.plan.plan.items, "a hybrid batch runs co-scheduled"
    again = backend.attend(query, k_cache, v_cache, meta, 16 ** -0.5)  # the next layer: the same plan
    assert torch.equal(again, out)
    _, k_cache, v_cache, decodes = make_inputs([], [(1, 9), (1, 33)], heads=4, kv_heads=2, head_dim=16,
                                               block_size=16, dtype=torch.float32)
    backend.attend(query[:2], k_cache, v_cache, decodes, 16 ** -0.5)
    from sarathi_lab.attention.triton_backend import PodLaunch

    assert not isinstance(decodes.plan, PodLaunch), "a decode-only batch has nothing to overlap: the sequential kernel"


def test_pod_is_refused_beside_the_torch_attention():
    from sarathi_lab import LLM
    from sarathi_lab.config import ConfigError

    with pytest.raises(ConfigError, match="^attention_hybrid='pod' is invalid with the torch attention"):
        LLM(model="tiny", device="cpu", attention="torch", attention_hybrid="pod")
    with pytest.raises(ConfigError, match="^attention_hybrid='pods' is invalid: .*sequential"):
        LLM(model="tiny", device="cpu", attention="triton", attention_hybrid="pods")


@pytest.mark.e2e
def test_engine_greedy_tokens_are_the_same_co_scheduled(monkeypatch):
    import random

    import sarathi_lab.attention.triton_backend as backend
    from sarathi_lab import LLM

    calls = []
    monkeypatch.setattr(backend, "pod_attention", lambda *a, **k: calls.append(1) or pod_attention(*a, **k))
    random.seed(0)
    prompts = [[random.randrange(4096) for _ in range(n)] for n in (20, 6, 9)]
    tokens = {}
    for hybrid in ("sequential", "pod"):
        # chunk_size 16 splits the first prompt; later prompts' prefills share batches with decodes.
        llm = LLM(model="tiny", attention="triton", attention_hybrid=hybrid, device="cpu", dtype="float32",
                  chunk_size=16, max_batch_size=3, warmup_iters=0)
        with using(always(1, 2, 4, 8)):
            tokens[hybrid] = llm.generate(prompts, max_new_tokens=3)
    assert any(it.num_prefill_tokens and it.num_decode_tokens for it in llm.metrics.iterations), "no hybrid batch"
    assert calls, "no layer ran co-scheduled"
    assert tokens["pod"] == tokens["sequential"]


@pytest.mark.e2e
def test_the_run_refuses_pod_beside_the_torch_attention_in_one_line(tmp_path):
    import os
    import subprocess
    import sys

    from tests.test_cli_refusals import PATCHES

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "SARATHI", "WANDB"))}
    done = subprocess.run([sys.executable, "-c", PATCHES, "device=cpu", "engine.attention_hybrid=pod", "logger=none",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 2, done.stdout[-1000:] + done.stderr[-2000:]
    line = ("error: engine.attention_hybrid='pod' is invalid with the torch attention: it is a Triton kernel; "
            "allowed: sequential, or with engine.attention=triton")
    assert done.stderr.splitlines() == [line], done.stderr
