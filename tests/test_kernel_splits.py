"""The split KV walk of the Triton paged attention (attention_plan.py, split_merge.py): every split
count equals attention/reference.py in Triton's interpreter, whatever the context lengths it meets;
padded requests of context 0 (a CUDA graph's spare rows) disturb no other row; the kernels compile for
Hopper without register spills, with the registers and shared memory occupancy.py plans with; and
the plan the kernel uses fills every benchmark shape's grid to (or just under) a whole number of waves."""
from __future__ import annotations

import json

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sarathi_kernels.attention_plan import cdiv, plan_launch, wave_of
from sarathi_kernels.occupancy import H200, GpuLimits
from sarathi_kernels.paged_attention import paged_attention
from sarathi_kernels.split_rule import SplitRule, most_splits

from tests.test_kernels import assert_close, expected, make_inputs
from tests.triton_compile import compile_for_gpu

H200_SMS = 132


def with_padding_rows(query, meta, pad: int):
    """The batch with ``pad`` more one-token requests of context 0 at its end, as the decode graphs
    pad a batch: their tables are zeros and their query rows random."""
    if not pad:
        return query, meta.query_start_loc, meta.seq_lens, meta.block_tables
    starts = torch.cat([meta.query_start_loc, meta.query_start_loc[-1] + torch.arange(1, pad + 1, dtype=torch.int32)])
    seq_lens = torch.cat([meta.seq_lens, torch.zeros(pad, dtype=torch.int32)])
    tables = torch.cat([meta.block_tables, torch.zeros(pad, meta.block_tables.shape[1], dtype=torch.int32)])
    return torch.cat([query, torch.randn(pad, *query.shape[1:])]), starts, seq_lens, tables


@settings(max_examples=14, deadline=None)
@given(chunk=st.integers(1, 40), prefix=st.integers(0, 150), decodes=st.lists(st.integers(1, 150), max_size=3),
       heads=st.sampled_from([(2, 2), (4, 1), (4, 2), (6, 2)]), block_size=st.sampled_from([16, 32]),
       block_n=st.sampled_from([16, 32]), num_splits=st.integers(1, 6), pad=st.integers(0, 2),
       seed=st.integers(0, 2**16))
# A chunk over a prefix beside decodes; a short chunk split into more splits than it has key tiles.
@example(chunk=33, prefix=100, decodes=[1, 17, 64], heads=(4, 1), block_size=16, block_n=16, num_splits=4, pad=2,
         seed=0)
@example(chunk=5, prefix=0, decodes=[], heads=(2, 2), block_size=32, block_n=16, num_splits=6, pad=0, seed=1)
def test_split_walks_match_reference(chunk, prefix, decodes, heads, block_size, block_n, num_splits, pad, seed):
    torch.manual_seed(seed)
    num_heads, num_kv_heads = heads
    query, k_cache, v_cache, meta = make_inputs([(chunk, prefix + chunk)], [(1, n) for n in decodes], heads=num_heads,
                                                kv_heads=num_kv_heads, head_dim=16, block_size=block_size,
                                                dtype=torch.float32)
    ref = expected(query, k_cache, v_cache, meta)
    padded, starts, seq_lens, tables = with_padding_rows(query, meta, pad)
    out = torch.full_like(padded, float("nan"))
    paged_attention(padded, k_cache, v_cache, starts, seq_lens, tables, 16 ** -0.5, out=out, block_n=block_n,
                    num_splits=num_splits)
    assert_close(out[: len(query)], ref, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_split_walks_in_half_precision(dtype):
    # Partials stay fp32 whatever the inputs; only the merged output is rounded to the dtype.
    query, k_cache, v_cache, meta = make_inputs([(20, 90)], [(1, 70)], heads=4, kv_heads=2, head_dim=32,
                                                block_size=16, dtype=dtype)
    out = paged_attention(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                          32 ** -0.5, block_n=16, num_splits=3)
    assert_close(out, expected(query, k_cache, v_cache, meta), dtype)


def test_the_planned_split_runs_on_a_small_gpu():
    # A chunk of 8 tokens of 2 KV heads is 2 programs; on 8 SMs the plan splits the walk.
    query, k_cache, v_cache, meta = make_inputs([(8, 600)], [], heads=4, kv_heads=2, head_dim=16, block_size=16,
                                                dtype=torch.float32)
    plan = plan_launch(8, 1, 4, 2, max_seq_len=meta.block_tables.shape[1] * 16, element_size=4,
                       max_query_len=8, num_sms=8)
    assert plan.num_splits > 1
    out = paged_attention(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                          16 ** -0.5, max_query_len=8, num_sms=8)
    assert_close(out, expected(query, k_cache, v_cache, meta), torch.float32)


def test_a_graph_s_split_count_holds_at_other_contexts():
    # A launch planned once, from the widest table it holds, meets any contexts up to it, including ones
    # shorter than a key tile a split.
    width, block_size, rule = 8, 16, SplitRule(min_key_tiles=1)
    plan = plan_launch(2, 2, 4, 1, max_seq_len=width * block_size, element_size=4, max_query_len=1, num_sms=H200_SMS,
                       rule=rule)
    assert plan.num_splits == width * block_size // plan.block_n  # capped by the widest table's key tiles
    for lens in ([1, 3], [128, 65], [64, 127]):
        query, k_cache, v_cache, meta = make_inputs([], [(1, n) for n in lens], heads=4, kv_heads=1, head_dim=16,
                                                    block_size=block_size, dtype=torch.float32)
        tables = torch.zeros(2, width, dtype=torch.int32)
        tables[:, : meta.block_tables.shape[1]] = meta.block_tables
        out = paged_attention(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, tables, 16 ** -0.5,
                              max_query_len=1, num_splits=plan.num_splits)
        assert_close(out, expected(query, k_cache, v_cache, meta), torch.float32)


def benchmark_shapes():
    """The GPU suite's attention shapes: (name, tokens, requests, max_query_len, longest context)."""
    for c in (64, 128, 256, 512):
        for prefix in (0, 512, 1024, 2048, 3072):
            yield f"c={c},prefix={prefix}", c, 1, c, prefix + c
    for b in (1, 2, 4, 8, 16, 32, 64):
        for ctx in (512, 1024, 2048, 4096):
            yield f"decode b={b},ctx={ctx}", b, b, 1, ctx
    for n in (512, 1024, 2048, 4096):
        yield f"prefill {n}", n, 1, n, n


@pytest.mark.parametrize("limits", [H200, GpuLimits(num_sms=108, shared_bytes_per_sm=164 * 1024)],
                         ids=["h100/h200", "a100"])
@pytest.mark.parametrize("heads,kv_heads", [(40, 40), (32, 8)], ids=["llama-13b", "gqa-32/8"])
def test_every_benchmark_shape_lands_at_or_just_under_whole_waves(heads, kv_heads, limits):
    # A split grid fills its waves: one more split that would shorten the longest walk would spill into
    # a wave more, unless the split count is at the rule's cap (too few key tiles a split, the most
    # splits); an unsplit one would spill into a second wave with 2 splits.
    off = []
    for name, tokens, requests, max_query_len, context in benchmark_shapes():
        plan = plan_launch(tokens, requests, heads, kv_heads, max_seq_len=context, element_size=2,
                           max_query_len=max_query_len, limits=limits)
        wave = wave_of(plan.kind, plan.tiles, limits)
        programs = plan.working_tiles * kv_heads
        key_tiles = cdiv(context, plan.block_n)
        cap = most_splits(programs, key_tiles, wave)
        s = plan.num_splits
        whole = cdiv(programs * s, wave)
        if s < cap and programs * (s + 1) <= whole * wave and cdiv(key_tiles, s + 1) < cdiv(key_tiles, s):
            off.append(f"{name}: {s} splits x {programs} programs = {programs * s / wave:.2f} waves of {wave}")
        if s == 1 and cap > 1 and 2 * programs <= wave:
            off.append(f"{name}: unsplit at {programs / wave:.2f} of a wave, where 2 splits fit in it")
        if name.startswith("prefill") and tokens >= 1024:
            assert s == 1, f"{name} has programs enough and must run unsplit"
    assert not off, "; ".join(off)


def test_the_issue_s_chunk_is_split_within_one_wave():
    # LLaMA-13B's 64-token chunk over a 3K prefix: 40 programs unsplit, each walking 3K keys alone. A
    # 64-row tile holds 2 CTAs a SM: a wave is 264 programs, and 6 splits (240) fill it where 7 (280)
    # would leave a second wave of 16.
    plan = plan_launch(64, 1, 40, 40, max_seq_len=3136, max_query_len=64, num_sms=H200_SMS)
    assert plan.working_tiles * plan.num_kv_heads == 40 and wave_of(plan.kind, plan.tiles, H200) == 264
    assert plan.num_splits == 6


def test_no_split_without_a_gpu_or_with_programs_enough():
    assert plan_launch(64, 1, 40, 40, max_seq_len=3136, max_query_len=64).num_splits == 1
    assert plan_launch(64, 64, 40, 40, max_seq_len=4096, max_query_len=1, num_sms=H200_SMS).num_splits == 1


def test_bad_split_count_is_refused():
    with pytest.raises(ValueError, match="num_splits must be >= 1, got 0"):
        plan_launch(4, 1, 4, 4, max_seq_len=64, num_splits=0)


# Compiled for Hopper (through ptxas, no GPU needed) with the alignment an engine launch has (every
# pointer and stride a multiple of 16, head_dim 128): ptxas's own count of spilled registers.
_SPILLS = """
import json
import triton.language as tl
from sarathi_kernels.occupancy import SM90_RESOURCES
from sarathi_kernels.paged_attention import _paged_attention_kernel as attention
from sarathi_kernels.split_merge import _merge_splits_kernel as merge

def aligned(kernel):
    return [n for n in kernel.arg_names if n.endswith("_ptr") or n.startswith("stride") or n == "head_dim"]

types = dict(q_ptr="*bf16", k_cache_ptr="*bf16", v_cache_ptr="*bf16", out_ptr="*bf16", part_ptr="*fp32",
             lse_ptr="*fp32", scale_log2="fp32")
found, tabulated = {}, {}
# (kind, rows, warps, cache block, GQA group): decode tiles alone and beside chunks, prefill tiles of MHA
# and GQA, a cache block holding a key tile, tall prefill tiles.
for kind, block_m, warps, block_size, group in (("decode", 16, 4, 16, 1), ("decode", 16, 4, 16, 4),
                                                ("prefill", 64, 4, 16, 1), ("prefill", 64, 4, 16, 4),
                                                ("prefill", 64, 4, 64, 1), ("prefill", 128, 8, 16, 1),
                                                ("prefill", 128, 8, 16, 4)):
    kernel = compile(attention, types, dict(BLOCK_SIZE=block_size, GROUP=group, GROUP_PAD=group, HEAD_DIM_PAD=128,
                                            BLOCK_M=block_m, BLOCK_N=64, DOT_DTYPE=tl.bfloat16, PRECISION=None,
                                            DECODE=kind == "decode"),
                     arch=90, aligned=aligned(attention), num_warps=warps)
    name = f"{kind} m={block_m} warps={warps} block={block_size} group={group}"
    found[name] = spill_bytes(kernel, 90)
    if (kind, block_m, warps) in SM90_RESOURCES and block_size == 16 and group == 1:
        table = SM90_RESOURCES[kind, block_m, warps]
        tabulated[name] = [[found[name][0], kernel.metadata.shared], [table.registers, table.shared_bytes]]
for decode in (False, True):
    kernel = compile(merge, dict(part_ptr="*fp32", lse_ptr="*fp32", out_ptr="*bf16"),
                     dict(BLOCK_H=16, HEAD_DIM_PAD=128, DECODE=decode, ROW_SPLITS=not decode), arch=90,
                     aligned=aligned(merge))
    found[f"merge decode={decode}"] = spill_bytes(kernel, 90)
print(json.dumps([found, tabulated]))
"""


def test_kernels_compile_for_hopper_without_spills_as_tabulated():
    done = compile_for_gpu(_SPILLS)
    assert done.returncode == 0, done.stderr[-3000:]
    found, tabulated = json.loads(done.stdout.strip().splitlines()[-1])
    assert {name: spilled for name, (_, spilled) in found.items() if spilled} == {}, found
    # occupancy.py's table is what ptxas says (registers, shared bytes), so the waves are the compiler's.
    assert len(tabulated) == 3 and all(got == table for got, table in tabulated.values()), tabulated
