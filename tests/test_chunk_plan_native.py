"""The compiled planner (plan_native.py, csrc/plan/chunk_plan.cpp) makes the numpy planner's very
work, field for field and bit for bit (float sums included), on hypothesis batches and on the serving
shapes it meets; and where its library cannot be built, chunk_plan plans in numpy."""
import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sarathi_kernels import chunk_plan as cp
from sarathi_kernels import cpu_build, plan_native

pytestmark = pytest.mark.skipif(not plan_native.available(), reason="no C++ compiler: numpy plans")


def _both(query_lens, seq_lens, heads, block_q, block_n, programs, **knobs):
    native = cp.plan_chunks(query_lens, seq_lens, heads, block_q, block_n, programs, **knobs)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(plan_native, "plan", lambda *a: None)
        numpy = cp.plan_chunks(query_lens, seq_lens, heads, block_q, block_n, programs, **knobs)
    return native, numpy


def _assert_same(native, numpy):
    for field in dataclasses.fields(cp.ChunkWork):
        a, b = getattr(native, field.name), getattr(numpy, field.name)
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), field.name
        else:
            assert type(a) is type(b) and a == b, (field.name, a, b)


@settings(max_examples=300, deadline=None)
@given(batch=st.lists(st.tuples(st.integers(1, 300), st.integers(0, 3000)), min_size=1, max_size=12),
       heads=st.sampled_from([1, 2, 8, 40]), block_q=st.sampled_from([1, 16, 64, 128]),
       block_n=st.sampled_from([16, 64]), programs=st.integers(2, 400),
       split_cost=st.sampled_from([0.0, 0.3, 1.0, 1.7]), base=st.sampled_from([0.0, 1.0, 0.25]),
       max_pieces=st.integers(2, 16))
# A chunk of 512 over a 3K prefix with 40 heads on 132 slots (tall tiles: a tail wave), and decodes
# just past a wave of 396.
@example(batch=[(512, 3072)], heads=40, block_q=128, block_n=64, programs=132, split_cost=1.0, base=1.0,
         max_pieces=2)
@example(batch=[(1, 900)] * 10, heads=40, block_q=1, block_n=64, programs=396, split_cost=1.0, base=0.0,
         max_pieces=16)
# A flat grid of two shares ties the best plan: the unsplit grid wins ties, and only it.
@example(batch=[(1, 64), (65, 192)], heads=8, block_q=64, block_n=64, programs=33, split_cost=1.0, base=0.0,
         max_pieces=2)
def test_the_compiled_planner_makes_the_numpy_plan(batch, heads, block_q, block_n, programs,
                                                   split_cost, base, max_pieces):
    query_lens = [q for q, _ in batch]
    seq_lens = [q + prefix for q, prefix in batch]
    _assert_same(*_both(query_lens, seq_lens, heads, block_q, block_n, programs,
                        split_cost=split_cost, max_pieces=max_pieces, base_cost=base))


@pytest.mark.parametrize("decodes", [1, 9, 10, 17, 64, 128])
def test_serving_decodes_plan_alike(decodes):
    """Decode batches as the engine plans them on an H100 (LLaMA-13B: 40 KV heads, 3 CTAs a SM)."""
    rng = np.random.default_rng(decodes)
    seq_lens = rng.integers(64, 4096, decodes).tolist()
    _assert_same(*_both([1] * decodes, seq_lens, 40, 1, 64, 396, base_cost=0.0,
                        max_pieces=cp.piece_cap(decodes + 512)))


def test_a_missing_library_plans_in_numpy(monkeypatch):
    monkeypatch.setattr(cpu_build, "function", lambda *a, **k: None)
    plan_native._fn.cache_clear()
    try:
        assert not plan_native.available()
        assert plan_native.plan(cp.tile_walks([64], [640], 64, 64), [64], 8, 64, 64, 16, 1.0, 16, 1.0, 2, 2) is None
        work = cp.plan_chunks([64], [640], 8, 64, 64, 16)
        assert work.critical_path > 0 and len(work.items)
    finally:
        plan_native._fn.cache_clear()


def test_the_planner_is_built_for_exact_floats():
    flags = cpu_build.compile_flags(lib=cpu_build.PLANNER)
    assert "-ffp-contract=off" in flags and not any("fast-math" in f for f in flags)
    assert cpu_build.PLANNER.sources and not set(cpu_build.PLANNER.sources) & set(cpu_build.KERNELS.sources)


def test_both_libraries_load_in_one_process():
    """The loader knows a library by the path it was opened by (/proc/self/fd/N): the planner opened
    through the descriptor number the CPU kernels had used was handed the kernels."""
    code = ("from sarathi_kernels import cpu_build\n"
            "kernels, planner = cpu_build.library(), cpu_build.library(cpu_build.PLANNER)\n"
            "print(hasattr(kernels, 'argmax_f32'), hasattr(planner, 'chunk_plan_work'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          check=False, env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.stdout.split() == ["True", "True"], done.stderr


@pytest.mark.parametrize("knobs", [{"programs": 0}, {"max_pieces": 1}, {"split_cost": -1.0}])
def test_counts_that_would_divide_by_zero_are_refused(knobs):
    args = {"programs": 16, "max_pieces": 16, "split_cost": 1.0} | knobs
    with pytest.raises(ValueError, match=f"{next(iter(knobs))}="):
        cp.plan_chunks([64], [640], 8, 64, 64, args.pop("programs"), **args)
