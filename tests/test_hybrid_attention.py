"""The GPU suite's ``hybrid`` step (measure/profiling/hybrid_grid.py, hybrid_attention.py, measure/gpu/steps/hybrid.py)
on the CPU: every contender computes the reference attention of a hybrid batch; one that does not is caught and not
timed; the floors are the hand count; the GPU grid is the issue's batches; the step writes its table and resumes (its
dry run in the suite: tests/test_gpu_suite.py's whole dry run)."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from sarathi_lab.measure.gpu import state
from sarathi_lab.measure.gpu.context import Context
from sarathi_lab.measure.gpu.steps import hybrid as step
from sarathi_lab.measure.profiling import hybrid_attention as hybrid
from sarathi_lab.measure.profiling.attention_peers import Flex
from sarathi_lab.measure.profiling.hybrid_grid import CONTENDERS, GRIDS, POD, HybridCase

CPU = torch.device("cpu")


def _measure(case):
    return hybrid.measure(case, dtype=torch.float32, device=CPU, block_size=16, reps=1, warmup=0,
                          flex=Flex(compiled=False), copy_gbps=10.0, matmul_gflops=100.0)


@pytest.mark.parametrize("case", [HybridCase(4, 1, 16, 16, 3, 40), HybridCase(2, 2, 16, 24, 2, 24)],
                         ids=lambda c: c.label)
def test_every_contender_computes_the_reference_attention(case):
    row = _measure(case)
    assert not [row[f"{n}_error"] for n in CONTENDERS if f"{n}_error" in row]
    assert all(row[f"{n}_ms"] > 0 for n in CONTENDERS)
    sequential = min(row["engine_one_launch_ms"], row["engine_two_launches_ms"])
    assert row["over_sequential"] == row[f"{POD}_ms"] / sequential
    assert row["over_best_peer"] == row[f"{POD}_ms"] / min(row["sdpa_flash_ms"], row["flex_ms"])


def test_a_contender_that_disagrees_is_caught_and_not_timed(monkeypatch):
    right = hybrid.pod_call

    def off_by_a_percent(x, *args):
        fn, ms = right(x, *args)
        return (lambda: fn() * 1.01), ms

    monkeypatch.setattr(hybrid, "pod_call", off_by_a_percent)
    case = HybridCase(2, 2, 16, 16, 2, 32)
    row = _measure(case)
    assert "differs from the reference" in row["pod_error"] and row["pod_ms"] is None
    assert row["over_sequential"] is None and row["engine_one_launch_ms"] > 0
    metrics = {m.metric: m for m in step.shape_metrics(row, on_gpu=True)}
    assert metrics[f"hybrid_attention_max_rel_diff[{case.label}]"].holds is False
    assert metrics[f"hybrid_attention_over_sequential[{case.label}]"].holds is False


def test_the_floors_are_the_hand_count():
    # 40 heads x 128, a 256-token chunk over a 768-token prefix beside 16 decodes at 1024, bf16, at
    # 1000 GB/s and 100 TFLOP/s: the chunk's causally visible pairs are 256 x 768 + 256 x 257 / 2.
    case = HybridCase(40, 40, 128, 256, 16, 1024)
    pairs = 256 * 768 + 256 * 257 // 2
    chunk_s = max(4 * 128 * 40 * pairs / 100e12, (1024 * 40 * 128 * 2 * 2 + 2 * 256 * 40 * 128 * 2) / 1000e9)
    decodes_s = max(4 * 128 * 40 * 16 * 1024 / 100e12, 16 * (1024 * 40 * 128 * 2 * 2 + 2 * 40 * 128 * 2) / 1000e9)
    f = hybrid.floors(case, 2, 1000.0, 100e3)
    assert f["chunk_floor_ms"] == pytest.approx(chunk_s * 1e3)
    assert f["decodes_floor_ms"] == pytest.approx(decodes_s * 1e3)
    assert f["sequential_floor_ms"] == pytest.approx((chunk_s + decodes_s) * 1e3)
    assert f["floor_ms"] < f["sequential_floor_ms"]


def test_the_gpu_grid_is_the_issue_s_batches():
    grid = GRIDS["cuda"]
    cases = grid.cases()
    assert {(c.heads, c.kv_heads, c.head_dim) for c in cases} == {(40, 40, 128), (32, 8, 128)}
    assert {c.chunk for c in cases} == {256, 512} and {c.decodes for c in cases} == {16, 32}
    assert {c.context for c in cases} == {1024, 3072} and grid.dtype == "bfloat16"
    assert cases[0].label == "heads=40/40,c=256,b=16,ctx=1024"
    assert grid.flex_compiles == 8 and 60 < grid.estimate_s() < 180


def test_the_step_resumes(tmp_path, monkeypatch):
    grid = GRIDS["cpu"]
    small = type(grid)(**{**grid.__dict__, "heads": ((2, 2), (4, 1)), "decodes": (2,)})
    monkeypatch.setitem(GRIDS, "cpu", small)
    ctx = Context(tmp_path, state.step_dir(tmp_path, "hybrid"), True, "cpu", None)
    ctx.dir.mkdir(parents=True)
    metrics, notes = step.run(ctx, None)
    labels = [c.label for c in small.cases()]
    values = {m.metric: m for m in metrics}
    assert {f"hybrid_attention_over_sequential[{x}]" for x in labels} <= set(values)
    assert all(values[f"hybrid_attention_max_rel_diff[{x}]"].holds for x in labels)
    assert values["hybrid_attention_within_target"].holds is None  # no verdict on the interpreter's times
    assert any("ceilings measured by this step" in n for n in notes)
    table = pd.read_csv(ctx.dir / step.ROWS)
    assert list(table["shape"]) == labels
    table.iloc[:1].to_csv(ctx.dir / step.ROWS, index=False)
    measured = []
    real = hybrid.measure
    monkeypatch.setattr(hybrid, "measure", lambda case, **kw: measured.append(case.label) or real(case, **kw))
    step.run(ctx, None)
    assert measured == labels[1:]
