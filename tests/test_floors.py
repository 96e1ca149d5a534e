"""The two floors an iteration is held to (model/floors.py): the physical one, max(compute, memory)
of the whole iteration, and the sequential one, the sum of each kernel's own floor."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarathi_lab.model.floors import LAUNCH_FLOOR_S, attention_floor, floor, sequential_floor
from sarathi_lab.model.presets import PRESETS
from sarathi_lab.model.shape import Shape, iteration_cost, kernel_costs

SHAPES = [Shape.of(PRESETS[name]) for name in ("tiny", "llama-13b", "mistral-7b")]
# An H200's ceilings as the env step measured them (GB/s, GFLOP/s).
COPY_GBPS, MATMUL_GFLOPS = 4064.6, 771_981.0

batches = st.tuples(st.integers(0, 1024), st.integers(0, 64), st.integers(16, 4096)).filter(
    lambda t: t[0] + t[1] > 0 and t[0] <= t[2])


def _batch(chunk: int, decodes: int, context: int) -> tuple[list[int], list[int]]:
    queries = [chunk] * (chunk > 0) + [1] * decodes
    return queries, [context] * len(queries)


@settings(max_examples=40, deadline=None)
@given(batches, st.sampled_from(SHAPES), st.sampled_from([2, 4]), st.floats(100, 10_000), st.floats(1e4, 2e6))
def test_kernels_account_for_every_flop_and_at_least_every_byte(batch, shape, elem, copy_gbps, matmul_gflops):
    queries, contexts = _batch(*batch)
    flops, nbytes = iteration_cost(shape, queries, contexts, len(queries), elem)
    costs = kernel_costs(shape, queries, contexts, len(queries), elem)
    assert sum(f for f, _ in costs.values()) == pytest.approx(flops, rel=1e-12)
    assert sum(b for _, b in costs.values()) >= nbytes
    # Hence the sequential floor is never below the physical one.
    physical = floor(shape, queries, contexts, len(queries), elem, copy_gbps, matmul_gflops)
    sequential = sequential_floor(shape, queries, contexts, len(queries), elem, copy_gbps, matmul_gflops)
    assert sequential.seconds >= physical.seconds * (1 - 1e-12)
    assert sequential.seconds <= physical.compute_s + sum(k.memory_s for k in sequential.kernels.values()) + 1e-15


def test_a_balanced_hybrid_cannot_reach_its_physical_floor_one_kernel_after_another():
    # LLaMA-13B, a 256-token chunk beside 17 decodes at context 1K on an H200: compute ~9.2 ms and memory
    # ~10.1 ms overlap only when memory-bound and compute-bound kernels run at once; one after another
    # the GEMMs are compute-bound and the attention memory-bound, each at its own floor, ~1.28x.
    shape = Shape.of(PRESETS["llama-13b"])
    queries, contexts = _batch(256, 17, 1024)
    physical = floor(shape, queries, contexts, 18, 2, COPY_GBPS, MATMUL_GFLOPS)
    sequential = sequential_floor(shape, queries, contexts, 18, 2, COPY_GBPS, MATMUL_GFLOPS)
    assert physical.compute_s * 1e3 == pytest.approx(9.24, abs=0.05)
    assert physical.memory_s * 1e3 == pytest.approx(10.09, abs=0.05)
    assert sequential.seconds / physical.seconds == pytest.approx(1.28, abs=0.02)
    assert sequential.kernels["gate_up_proj"].bound == "compute" and sequential.kernels["attention"].bound == "memory"


def test_decode_only_batches_have_the_same_two_floors_nearly():
    # Every kernel of a decode batch is memory-bound: running them in turn loses almost nothing.
    shape = Shape.of(PRESETS["llama-13b"])
    queries, contexts = _batch(0, 18, 1024)
    physical = floor(shape, queries, contexts, 18, 2, COPY_GBPS, MATMUL_GFLOPS)
    sequential = sequential_floor(shape, queries, contexts, 18, 2, COPY_GBPS, MATMUL_GFLOPS)
    assert 1.0 <= sequential.seconds / physical.seconds < 1.01


def test_a_prefix_0_chunks_attention_is_held_to_a_launch_floor_of_a_few_microseconds():
    assert 1e-6 <= LAUNCH_FLOOR_S <= 10e-6
    # 64 tokens over no prefix: well under a microsecond of roofline, so the launch is its floor.
    alone = attention_floor(40, 40, 128, [64], [64], 2, COPY_GBPS, MATMUL_GFLOPS)
    assert max(alone.compute_s, alone.memory_s) < 1e-6 and alone.seconds == LAUNCH_FLOOR_S and alone.bound == "launch"
    # Over a 3K prefix its keys and values take longer than a launch: the roofline is the floor.
    over = attention_floor(40, 40, 128, [64], [3072 + 64], 2, COPY_GBPS, MATMUL_GFLOPS)
    assert over.seconds > LAUNCH_FLOOR_S and over.bound == "memory"


def test_the_floor_table_lists_every_launch_iteration_with_both_floors():
    from sarathi_lab.analysis.launch_grid import CASES, MORE_CONTEXTS
    from sarathi_lab.measure.profiling.floor_table import markdown, rows

    found = rows(COPY_GBPS, MATMUL_GFLOPS / 1e3)
    assert len(found) == len(CASES) * (1 + len(MORE_CONTEXTS["cuda"]))
    assert all(r["sequential_floor_ms"] >= r["floor_ms"] * (1 - 1e-12) for r in found)
    by_name = {r["iteration"]: r for r in found}
    assert by_name["c=239+b=17"]["sequential_over_floor"] < by_name["c=256+b=17"]["sequential_over_floor"]
    assert "| c=256+b=17,ctx=3072 |" in markdown(found)


def test_the_floor_table_takes_the_read_rate_where_the_env_step_measured_one(tmp_path, capsys):
    from sarathi_lab.measure.profiling.floor_table import main

    env = tmp_path / "env.json"
    env.write_text(json.dumps({"device": "X", "copy_gbps": 2890.0, "read_gbps": 3080.0, "matmul_tflops": 784.0}))
    assert main(["--env", str(env)]) == 0
    assert capsys.readouterr().out.startswith("X: read 3080 GB/s, bf16 matmul 784 TFLOP/s")
