"""The attention benchmark against its peers (measure/profiling/attention_peers.py, the GPU suite's ``attention``
step): the floor's arithmetic by hand, the shape grid the issue asks for and its compile count, the
metric names a reviewer's script reads, and every contender computing the same attention as
attention/reference.py (the engine's kernel in Triton's interpreter here)."""
from __future__ import annotations

import re
from contextlib import nullcontext

import pandas as pd
import pytest
import torch

from sarathi_lab.measure.gpu import state
from sarathi_lab.measure.gpu.context import Context
from sarathi_lab.measure.gpu.plan import BY_NAME, HEAD
from sarathi_lab.measure.gpu.steps import attention as step
from sarathi_lab.measure.profiling import attention_peers as peers
from sarathi_lab.measure.profiling.attention_grid import CONTENDERS, FLEX, GRIDS, SDPA, Case
from sarathi_lab.model import PRESETS
from sarathi_lab.model.floors import attention_floor
from sarathi_lab.model.shape import Shape, iteration_cost

CPU = torch.device("cpu")
# What a reviewer's script matches: the ratio, then the shape in one of its three forms.
NAME = re.compile(r"^attention_over_(best_peer|floor)\[heads=\d+/\d+,"
                  r"(prefill=\d+|c=\d+,prefix=\d+|b=\d+,ctx=\d+)\]$")


def test_the_attention_floor_is_the_hand_count():
    # LLaMA-13B, a 256-token chunk over 3072 cached tokens: row r sees 3072 + r + 1 keys.
    pairs = 256 * 3072 + 256 * 257 // 2
    assert pairs == 819_328
    least = attention_floor(40, 40, 128, [256], [3328], 2, copy_gbps=4000.0, matmul_gflops=800_000.0)
    assert least.flops == 4 * 40 * 128 * pairs == 16_779_837_440
    kv, qo = 2 * 40 * 128 * 2 * 3328, 2 * 40 * 128 * 2 * 256   # K and V of the context; q in, o out
    assert least.bytes == kv + qo == 73_400_320
    assert least.compute_s == pytest.approx(16_779_837_440 / 800e12) and least.bound == "compute"
    # Mistral-7B's heads, 18 decodes at 1024: 8 KV heads read, 32 query heads' q and o.
    dec = attention_floor(32, 8, 128, [1] * 18, [1024] * 18, 2, copy_gbps=4000.0, matmul_gflops=800_000.0)
    assert dec.flops == 4 * 32 * 128 * 18 * 1024
    assert dec.bytes == 2 * 8 * 128 * 2 * 18 * 1024 + 2 * 32 * 128 * 2 * 18 == 75_792_384
    assert dec.bound == "memory" and dec.seconds == pytest.approx(75_792_384 / 4000e9)


def test_an_iterations_attention_flops_are_the_attention_floors_in_every_layer():
    s = Shape.of(PRESETS["llama-13b"])
    linear_and_head = 2 * 256 * s.layer_linear_params * s.layers + 2 * s.hidden * s.vocab
    without = iteration_cost(s, [256], [256], 1, 2)[0] - linear_and_head
    assert without == s.layers * attention_floor(40, 40, 128, [256], [256], 2, 1.0, 1.0).flops


def test_the_gpu_grid_is_the_issues_shapes_at_the_presets_heads():
    grid = GRIDS["cuda"]
    for model, heads in zip(("llama-13b", "mistral-7b"), grid.heads):
        s = Shape.of(PRESETS[model])
        assert (s.heads, s.kv_heads) == heads and s.head_dim == grid.head_dim
    assert grid.dtype == "bfloat16" and (min(grid.prefills), max(grid.prefills)) == (512, 4096)
    assert grid.chunks == (64, 128, 256, 512) and (min(grid.prefixes), max(grid.prefixes)) == (0, 3072)
    assert (min(grid.decode_batches), max(grid.decode_batches)) == (1, 64) and 18 in grid.decode_batches
    assert (min(grid.decode_contexts), max(grid.decode_contexts)) == (512, 4096)
    cases = grid.cases()
    assert len(cases) == 2 * (4 + 4 * 3 + 3 * 3) and len({c.label for c in cases}) == len(cases)
    # FlexAttention runs (and compiles once) at each chunk over a cached prefix: 2 heads x 4 chunks x 2 prefixes.
    assert grid.flex_compiles == 16 == sum(c.kind == "chunk" and c.prefix > 0 for c in cases)
    assert all(SDPA in c.peers for c in cases)
    # The step's two minutes on an H100, and the plan's minutes are that arithmetic.
    assert grid.estimate_s() <= 120
    assert BY_NAME["attention"].minutes == round(grid.estimate_s() / 60, 1)
    names = [s.name for s in HEAD]
    # The headline call's order (measure/gpu/queue.py): the engine's iterations, then the attention, then the rest.
    assert names[:3] == ["env", "launch", "attention"]


def test_labels_are_the_forms_a_reviewer_reads():
    assert Case("chunk", 40, 40, 128, 256, 3328).label == "heads=40/40,c=256,prefix=3072"
    assert Case("prefill", 32, 8, 128, 2048, 2048).label == "heads=32/8,prefill=2048"
    assert Case("decode", 40, 40, 128, 1, 1024, 18).label == "heads=40/40,b=18,ctx=1024"


def _row(case: Case, engine: float, peer: float, floor: float) -> dict:
    return {"shape": case.label, "kind": case.kind, "query_len": case.query_len, "context": case.context,
            "engine_ms": engine, "sdpa_flash_ms": peer, "flex_ms": float("nan"), "floor_ms": floor,
            "over_best_peer": engine / peer, "over_floor": engine / floor, "max_rel_diff": 1e-3}


def test_metric_names_and_targets():
    chunk, decode = Case("chunk", 40, 40, 128, 256, 3328), Case("decode", 40, 40, 128, 1, 1024, 18)
    metrics = {m.metric: m for m in step.shape_metrics(_row(chunk, 0.02, 0.018, 0.015), on_gpu=True)}
    assert metrics["attention_over_best_peer[heads=40/40,c=256,prefix=3072]"].holds is True   # 1.11x
    assert metrics["attention_over_floor[heads=40/40,c=256,prefix=3072]"].holds is True       # 1.33x of 2
    assert {f"attention_{name}_ms[heads=40/40,c=256,prefix=3072]" for name in ("engine", "sdpa_flash", "floor")
            } <= set(metrics)
    assert "attention_flex_ms[heads=40/40,c=256,prefix=3072]" not in metrics   # not measured: no value
    assert sum(bool(NAME.match(name)) for name in metrics) == 2
    dec = {m.metric: m for m in step.shape_metrics(_row(decode, 0.05, 0.04, 0.04), on_gpu=True)}
    assert dec["attention_over_floor[heads=40/40,b=18,ctx=1024]"].holds is False               # 1.25x of 1.2
    assert dec["attention_over_best_peer[heads=40/40,b=18,ctx=1024]"].target == ""             # no peer target
    # On the CPU the interpreter's times judge nothing.
    assert all(m.holds is None for m in step.shape_metrics(_row(chunk, 9.0, 1.0, 1e-3), on_gpu=False)
               if m.target.startswith("<="))
    counts = {m.metric: m.value for m in step.summary_metrics([_row(chunk, 0.02, 0.018, 0.015),
                                                               _row(decode, 0.05, 0.04, 0.04)], on_gpu=True)}
    assert counts == {"attention_shapes_within_peer_target": "1/1", "attention_chunks_within_floor_target": "1/1",
                      "attention_decodes_within_floor_target": "0/1"}


def test_a_chunk_over_a_short_prefix_shows_its_floor_without_a_target():
    # Its floor is microseconds (the launch floor at prefix 0): the 2x target holds from a 1K prefix.
    alone, over_1k = Case("chunk", 40, 40, 128, 64, 64), Case("chunk", 40, 40, 128, 64, 1024 + 64)
    shown = {m.metric: m for m in step.shape_metrics(_row(alone, 0.02, 0.018, 0.004), on_gpu=True)}
    assert shown["attention_over_floor[heads=40/40,c=64,prefix=0]"].target == ""
    assert shown["attention_over_floor[heads=40/40,c=64,prefix=0]"].holds is None
    held = {m.metric: m for m in step.shape_metrics(_row(over_1k, 0.02, 0.018, 0.004), on_gpu=True)}
    assert held["attention_over_floor[heads=40/40,c=64,prefix=1024]"].target == "<= 2.0"
    counts = {m.metric: m.value for m in step.summary_metrics([_row(alone, 0.02, 0.018, 0.004),
                                                               _row(over_1k, 0.02, 0.018, 0.004)], on_gpu=True)}
    assert counts["attention_chunks_within_floor_target"] == "0/1"


@pytest.mark.parametrize("case", [Case("chunk", 4, 1, 16, 16, 48), Case("decode", 2, 2, 16, 1, 40, 3),
                                  Case("prefill", 2, 2, 32, 24, 24)], ids=lambda c: c.label)
def test_every_contender_computes_the_reference_attention(case):
    row = peers.measure(case, dtype=torch.float32, device=CPU, block_size=16, reps=1, warmup=0,
                        flex=peers.Flex(compiled=False), copy_gbps=10.0, matmul_gflops=100.0)
    ran = [p for p in case.peers if p not in row["peers_not_available"].split()]   # no cuDNN here
    names = ("engine", *ran)
    assert not [row[f"{n}_error"] for n in names if f"{n}_error" in row]
    assert all(row[f"{n}_rel_diff"] < peers.TOLERANCE[torch.float32] for n in names)
    assert all(row[f"{n}_ms"] > 0 for n in names) and (FLEX in names) == (case.kind == "chunk")
    assert row["over_best_peer"] == row["engine_ms"] / min(row[f"{n}_ms"] for n in ran)


def test_a_contender_that_disagrees_is_caught_and_not_timed(monkeypatch):
    case = Case("chunk", 2, 2, 16, 16, 48)
    right = peers.engine_call

    def off_by_a_percent(x, **kwargs):
        fn = right(x, **kwargs)
        return lambda: fn() * 1.01

    monkeypatch.setattr(peers, "engine_call", off_by_a_percent)
    row = peers.measure(case, dtype=torch.float32, device=CPU, block_size=16, reps=1, warmup=0,
                        flex=peers.Flex(compiled=False), copy_gbps=10.0, matmul_gflops=100.0)
    assert "differs from the reference" in row["engine_error"] and row["engine_ms"] is None
    assert row["over_best_peer"] is None and row["sdpa_flash_ms"] > 0
    metrics = {m.metric: m for m in step.shape_metrics(row, on_gpu=False)}
    assert metrics[f"attention_max_rel_diff[{case.label}]"].holds is False


def test_rounds_interleave_the_contenders_each_starting_one_later():
    order = []
    calls = {name: (lambda n=name: order.append(n)) for name in "abc"}
    times = peers.time_interleaved(calls, reps=3, device=CPU, warmup=0)
    assert order == list("abc" "bca" "cab") and all(len(t) == 3 for t in times.values())


def test_the_step_resumes_and_its_figure_draws(tmp_path, monkeypatch):
    grid = GRIDS["cpu"]
    small = type(grid)(**{**grid.__dict__, "heads": ((2, 2),), "prefixes": (32,), "decode_batches": (2,)})
    monkeypatch.setitem(GRIDS, "cpu", small)
    ctx = Context(tmp_path, state.step_dir(tmp_path, "attention"), True, "cpu", None)
    ctx.dir.mkdir(parents=True)
    metrics, notes = step.run(ctx, None)
    labels = [c.label for c in small.cases()]
    names = {m.metric for m in metrics}
    assert {f"attention_over_best_peer[{x}]" for x in labels} <= names
    assert {f"attention_over_floor[{x}]" for x in labels} <= names
    assert any("ceilings measured by this step" in n for n in notes)
    table = pd.read_csv(ctx.dir / step.ROWS)
    assert list(table["shape"]) == labels
    # A rerun measures only the shapes the table lacks.
    table.iloc[:1].to_csv(ctx.dir / step.ROWS, index=False)
    measured = []
    real = peers.measure
    monkeypatch.setattr(peers, "measure", lambda case, **kw: measured.append(case.label) or real(case, **kw))
    step.run(ctx, None)
    assert measured == labels[1:]
    assert step.figure(tmp_path) and (tmp_path / "figures" / "attention.png").is_file()


def _two_chunks(flex):
    return [peers.measure(c, dtype=torch.float32, device=CPU, block_size=16, reps=1, warmup=0, flex=flex,
                          copy_gbps=10.0, matmul_gflops=100.0)
            for c in (Case("chunk", 4, 1, 16, 16, 48), Case("chunk", 2, 2, 16, 16, 48))]


def test_a_peer_that_fails_at_one_shape_is_still_timed_at_the_next(monkeypatch):
    flex = peers.Flex(compiled=False)
    real = flex.call

    def fails_with_gqa(case, x):
        if case.heads != case.kv_heads:
            raise RuntimeError("NoValidChoicesError: No choices to select")
        return real(case, x)

    monkeypatch.setattr(flex, "call", fails_with_gqa)
    failed, timed = _two_chunks(flex)
    assert failed["flex_error"] == "RuntimeError: NoValidChoicesError: No choices to select"
    assert failed["flex_ms"] is None and failed["best_peer_ms"] == failed["sdpa_flash_ms"]
    assert "flex_error" not in timed and timed["flex_ms"] > 0
    notes = step.failure_notes([failed, timed], CONTENDERS)
    assert any(n.startswith("flex not timed at 1 of 2 shapes") and failed["shape"] in n
               and timed["shape"] not in n for n in notes)


def test_sdpa_cudnn_is_a_peer_where_the_device_has_it(monkeypatch):
    # No cuDNN attention on the CPU: listed as not available, the best peer is among the others.
    absent, _ = _two_chunks(peers.Flex(compiled=False))
    assert absent["peers_not_available"] == "sdpa_cudnn" and "sdpa_cudnn_ms" not in absent
    assert any("not available on this device: sdpa_cudnn" in n for n in step.failure_notes([absent], ("flex",)))
    # Where it is, it runs with its own bottom-right mask (here on SDPA's CPU kernel, held to the
    # reference like every contender) and the best peer includes it.
    monkeypatch.setattr(peers, "cudnn_available", lambda device: True)
    monkeypatch.setattr(peers, "sdpa_kernel", lambda backend: nullcontext())
    present, _ = _two_chunks(peers.Flex(compiled=False))
    assert present["peers_not_available"] == "" and "sdpa_cudnn_error" not in present
    assert present["sdpa_cudnn_ms"] > 0 and present["sdpa_cudnn_rel_diff"] < peers.TOLERANCE[torch.float32]
    assert present["best_peer_ms"] == min(present[f"{n}_ms"] for n in ("sdpa_flash", "sdpa_cudnn", "flex"))
