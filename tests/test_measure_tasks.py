"""Each measurement task of ``sarathi_lab.measure.tasks`` on a tiny real engine whose clock is
virtual: the model's modules advance it by a known cost per token as they run, so every time a
task reports has an exact expected value, and a task that builds the wrong batch, labels a timing
wrongly or derives a quantity wrongly gets a wrong number."""
from __future__ import annotations

import math
import subprocess
import sys
import types
from pathlib import Path

import pytest

from sarathi_lab import LLM
from sarathi_lab.engine.clock import VirtualClock
from sarathi_lab.harness.schema import MeasureCfg
from sarathi_lab.harness.tasks import TASKS, measurement, task_names
from sarathi_lab.harness.workloads import split_length

# Seconds per token of each watched module, per layer; the qkv projection is charged by whole
# tiles of TILE tokens, as a GPU matmul is, so that the tile sweep has steps to find.
TILE, QKV, ATTENTION, O_PROJ, FFN = 16, 1e-4, 3e-5, 5e-5, 2e-4
PER_FORWARD = 2e-3  # charged once per forward (the "others" of the split)


def op_costs(tokens: int, layers: int) -> dict[str, float]:
    return {"qkv_proj": layers * QKV * math.ceil(tokens / TILE) * TILE, "attention": layers * ATTENTION * tokens,
            "o_proj": layers * O_PROJ * tokens, "ffn": layers * FFN * tokens, "others": PER_FORWARD}


def cost(tokens: int, layers: int) -> float:
    return sum(op_costs(tokens, layers).values())


@pytest.fixture(scope="module")
def llm():
    llm = LLM("tiny", device="cpu", dtype="float32", num_threads=1, seed=0)
    clock = llm.engine.clock = llm.engine.executor.clock = VirtualClock()
    model = llm.engine.executor.runner.model
    tokens = []

    def charge(per_token):
        # Registered before any task's hooks, so a task's timer around a module sees the charge.
        return lambda _module, _args, _out: clock.advance(per_token(tokens[-1]))

    model.register_forward_pre_hook(lambda _module, args: tokens.append(args[0].shape[0]))
    for layer in model.layers:
        layer.self_attn.qkv_proj.register_forward_hook(charge(lambda t: QKV * math.ceil(t / TILE) * TILE))
        layer.self_attn.o_proj.register_forward_hook(charge(lambda t: O_PROJ * t))
        layer.self_attn.register_forward_hook(charge(lambda t: ATTENTION * t))
        layer.mlp.register_forward_hook(charge(lambda t: FFN * t))
    model.register_forward_hook(charge(lambda t: PER_FORWARD))
    free = llm.block_manager.num_free
    yield llm
    assert llm.block_manager.num_free == free


@pytest.fixture(autouse=True)
def gives_back_its_blocks(request):
    if "llm" not in request.fixturenames:
        yield
        return
    llm = request.getfixturevalue("llm")
    free = llm.block_manager.num_free
    yield
    assert llm.block_manager.num_free == free, "the task left KV blocks allocated"


def _cfg(**kw) -> types.SimpleNamespace:
    measure = MeasureCfg(**{"reps": 2, "token_step": 8, "tile": TILE} | kw.pop("measure", {}))
    return types.SimpleNamespace(**{"seed": 0, "batch_size": 2, "seq_len": 24, "chunk": 16, "pd_ratio": 4.0} | kw,
                                 measure=measure)


def test_op_breakdown_splits_a_prefill_and_a_decode_iteration_by_operation(llm):
    layers = llm.model_config.num_hidden_layers
    summary, tables = measurement("op_breakdown")(_cfg(batch_size=2, seq_len=24), llm)
    ops = tables["ops"].set_index(["phase", "op"])
    for phase, tokens in (("prefill", 48), ("decode", 2)):
        expected = op_costs(tokens, layers) | {"total": cost(tokens, layers)}
        assert ops.loc[phase].ms.to_dict() == pytest.approx({op: s * 1e3 for op, s in expected.items()})
        assert set(ops.loc[phase].tokens) == {tokens}
    prefill, decode = cost(48, layers) * 1e3 / 48, cost(2, layers) * 1e3 / 2
    assert summary == pytest.approx({"prefill_ms_per_token": prefill, "decode_ms_per_token": decode,
                                     "decode_over_prefill": decode / prefill, "prefill_tokens_per_ms": 1 / prefill,
                                     "decode_tokens_per_ms": 1 / decode})


def test_iteration_sweep_times_each_token_count_and_the_step_past_each_tile(llm):
    layers = llm.model_config.num_hidden_layers
    summary, tables = measurement("iteration_sweep")(_cfg(seq_len=40, measure={"token_step": 8}), llm)
    total = tables["sweep"].query("op == 'total'").set_index("tokens").ms
    assert sorted(total.index) == [8, 16, 17, 24, 32, 33, 40]
    assert total.to_dict() == pytest.approx({n: cost(n, layers) * 1e3 for n in total.index})
    jumps = [cost(m + 1, layers) / cost(m, layers) - 1 for m in (16, 32)]
    assert summary["tile_jump"] == pytest.approx(sum(jumps) / 2) and summary["tile_jump"] > 0.1
    assert summary["ms_at_max_tokens"] == pytest.approx(cost(40, layers) * 1e3)
    assert summary["max_tokens_per_ms"] == pytest.approx(max(n / (cost(n, layers) * 1e3) for n in total.index))


def test_piggyback_charges_riding_decodes_what_they_add_to_the_chunk(llm):
    layers = llm.model_config.num_hidden_layers
    size, chunk = 3, 16
    summary, tables = measurement("piggyback")(_cfg(batch_size=size, seq_len=40, chunk=chunk), llm)
    table = tables["piggyback"].set_index("iteration")
    assert table.tokens.to_dict() == {"decode_only": size, "chunk_alone": chunk, "hybrid": chunk + size - 1}
    baseline = cost(size, layers) * 1e3 / size
    piggybacked = (cost(chunk + size - 1, layers) - cost(chunk, layers)) * 1e3 / (size - 1)
    assert summary == pytest.approx({"baseline_ms_per_decode": baseline, "piggybacked_ms_per_decode": piggybacked,
                                     "decode_speedup": baseline / piggybacked})


def test_reread_counts_the_kv_chunks_re_read_and_what_chunking_costs(llm):
    layers = llm.model_config.num_hidden_layers
    seq_len, pd_ratio, chunk = 50, 4.0, 16
    prompt, decode = split_length(seq_len, pd_ratio)
    summary, tables = measurement("reread")(_cfg(seq_len=seq_len, pd_ratio=pd_ratio, chunk=chunk,
                                                 measure={"reps": 1}), llm)
    pieces = [min(chunk, prompt - start) for start in range(0, prompt, chunk)]
    # Chunk k attends over everything cached before it and itself.
    kv_chunked = sum(min(start + chunk, prompt) for start in range(0, prompt, chunk))
    assert (summary["num_chunks"] == len(pieces) == 3
            and (summary["prompt_len"], summary["decode_len"]) == (prompt, decode))
    assert (summary["kv_tokens_read_whole"], summary["kv_tokens_read_chunked"]) == (prompt, kv_chunked)
    prefill_whole, prefill_chunked = cost(prompt, layers), sum(cost(n, layers) for n in pieces)
    decodes = (decode - 1) * cost(1, layers)  # the last prefill iteration samples the first token
    assert summary["prefill_slowdown"] == pytest.approx(prefill_chunked / prefill_whole)
    assert summary["end_to_end_slowdown"] == pytest.approx((prefill_chunked + decodes) / (prefill_whole + decodes))
    overhead = tables["overhead"].set_index("component")
    assert overhead.loc["prefill"].whole_ms == pytest.approx(prefill_whole * 1e3)
    assert list(overhead.index) == ["attention", "prefill", "end_to_end"]


def test_the_task_table_names_every_module_of_the_wing_and_imports_none_until_used():
    """The harness knows every task from its table, with nothing imported first (run.py imports no
    wing); naming one imports no task's module; each entry resolves to a function of its module."""
    code = ("import sys; from sarathi_lab.harness.tasks import task_names; print(','.join(task_names())); "
            "print(any(m.startswith('sarathi_lab.measure') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    names, imported = out.stdout.split()
    assert names.split(",") == list(task_names()) and imported == "False"
    wing = Path(__file__).parents[1] / "sarathi_lab" / "measure" / "tasks"
    assert sorted(TASKS) == sorted(p.stem for p in wing.glob("*.py") if not p.stem.startswith("_"))
    for name, target in TASKS.items():
        assert target == f"sarathi_lab.measure.tasks.{name}:run" and callable(measurement(name))
    with pytest.raises(ValueError, match="task='serve' is not a measurement"):
        measurement("serve")


def test_run_py_finds_the_tasks_without_the_wing():
    code = ("import sys, sarathi_lab.run; from sarathi_lab.harness.tasks import task_names; "
            "print(','.join(task_names())); print(any(m.startswith('sarathi_lab.measure') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    names, imported = out.stdout.split()[-2:]
    assert names.split(",") == list(task_names()) and imported == "False"


def test_the_op_split_under_a_cuda_graph_comes_from_an_eager_pass_scaled_to_the_replay(llm, monkeypatch):
    # A graph's replay runs no module, so hooks around its forward saw nothing and the split was all
    # "others". The split is timed eagerly, then scaled to the replay's time, its shares kept.
    from sarathi_lab.measure.profiling.batches import SyntheticBatches
    from sarathi_lab.measure.profiling.ops import OPS, time_by_op

    replay_s = 1e-3
    replay = lambda prepared, fused=False: llm.engine.clock.advance(replay_s)
    monkeypatch.setattr(llm.engine.executor, "forward", replay)
    batches = SyntheticBatches(llm)
    batch = batches.make(decodes=4, context=8)
    try:
        ops = time_by_op(llm, batch, reps=2)
    finally:
        batches.free(batch)
    layers = llm.model_config.num_hidden_layers
    eager = op_costs(4, layers)
    assert ops["total"] == pytest.approx(replay_s)
    assert sum(ops[op] for op in OPS) == pytest.approx(replay_s)
    for op in OPS:
        assert ops[op] == pytest.approx(eager[op] / sum(eager.values()) * replay_s)


def test_the_op_split_adds_up_to_the_bare_forward_whatever_the_hooks_cost(llm, monkeypatch):
    # Every clock read costs time here, as a device sync at each hook does on a GPU: the hooked ops
    # then sum to more than the bare forward, and a stacked split drawn from them overstated it.
    from sarathi_lab.measure.profiling.batches import SyntheticBatches
    from sarathi_lab.measure.profiling.ops import OPS, time_by_op

    clock, read = llm.engine.clock, llm.engine.clock.now

    def costly_read() -> float:
        clock.advance(1e-4)
        return read()

    monkeypatch.setattr(clock, "now", costly_read)
    batches = SyntheticBatches(llm)
    batch = batches.make(prefills=[(16, 0)])
    try:
        ops = time_by_op(llm, batch, reps=2)
    finally:
        batches.free(batch)
    layers = llm.model_config.num_hidden_layers
    assert ops["total"] == pytest.approx(cost(16, layers) + 1e-4)
    assert sum(ops[op] for op in OPS) == pytest.approx(ops["total"])
    assert all(ops[op] > 0 for op in OPS)


def test_the_tile_sweep_times_a_graph_of_the_exact_batch_not_the_engine_s_bucket(llm, monkeypatch):
    # On CUDA the engine would replay the graph of the next 128-token bucket, whose padding, not the
    # device's tile, would make the step: each count is captured as its own graph instead.
    import torch

    from sarathi_lab.measure.profiling import batches, ops
    from sarathi_lab.model import cuda_graphs

    events = []
    monkeypatch.setattr(cuda_graphs, "capture_cuda_graph",
                        lambda forward: ((lambda: events.append("replay")), forward(), None))
    backend = types.SimpleNamespace(replayable=True)
    cuda_runner = types.SimpleNamespace(device=torch.device("cuda"), model=types.SimpleNamespace(backend=backend),
                                        forward=lambda prepared: events.append(prepared) or "out")
    call = ops.replayable(cuda_runner, "this batch")
    assert (call(), events) == ("out", ["this batch", "replay"])
    # A backend that plans each batch on the host cannot be captured: the eager forward, uncaptured.
    backend.replayable, events[:] = False, []
    assert (ops.replayable(cuda_runner, "this batch")(), events) == ("out", ["this batch"])
    monkeypatch.setattr(llm.engine.executor, "forward", lambda _: pytest.fail("the bucket's path ran"))
    with batches.SyntheticBatches(llm, seed=0).made(prefills=[(17, 0)]) as batch:
        ops.forward_timer(llm, batch, exact=True)()
