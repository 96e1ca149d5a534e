"""Each measurement task under ``executor=sim``: no model is built, and every time it reports is
the simulated executor's cost model's prediction for the batch the task built (checked against the
cost model called directly, so a task that builds the wrong batch or labels a time wrongly fails)."""
from __future__ import annotations

import types

import pytest

from sarathi_lab import LLM
from sarathi_lab.harness.schema import MeasureCfg
from sarathi_lab.harness.tasks import measurement, task_names
from sarathi_lab.harness.workloads import split_length
from sarathi_lab.measure.profiling.ops import OPS

SIMULATED_TASKS = ("iteration_sweep", "op_breakdown", "piggyback", "reread")


@pytest.fixture(scope="module")
def llm():
    llm = LLM("tiny", executor="sim", sim_device="a6000", sim_cost_model="roofline", num_kv_blocks=64, seed=0)
    assert not hasattr(llm.engine.executor, "runner")  # no model, no weights
    free = llm.block_manager.num_free
    yield llm
    assert llm.block_manager.num_free == free


def _cfg(**kw) -> types.SimpleNamespace:
    measure = MeasureCfg(**{"reps": 2, "token_step": 8, "tile": 16} | kw.pop("measure", {}))
    return types.SimpleNamespace(**{"seed": 0, "batch_size": 3, "seq_len": 24, "chunk": 16, "pd_ratio": 4.0} | kw,
                                 measure=measure)


def _forward_ms(llm, prefills=(), decodes=()) -> float:
    return llm.engine.executor.cost_model.iteration_cost(prefills, decodes).forward_s * 1e3


def test_every_timing_task_has_a_simulated_path():
    # profile measures the engine (a real one only); capacity serves trials through the executor in
    # use, simulated or real, and times no forward of its own; pipeline_bubbles measures a real
    # pipeline's ranks and simulates its own twin beside it.
    assert set(SIMULATED_TASKS) == set(task_names()) - {"profile", "capacity", "pipeline_bubbles"}


def test_op_breakdown_reports_the_cost_models_prefill_and_decode(llm):
    summary, tables = measurement("op_breakdown")(_cfg(batch_size=3, seq_len=24), llm)
    ops = tables["ops"].set_index(["phase", "op"]).ms
    assert ops["prefill", "total"] == pytest.approx(_forward_ms(llm, prefills=[(24, 24)] * 3))
    assert ops["decode", "total"] == pytest.approx(_forward_ms(llm, decodes=[24] * 3))
    for phase in ("prefill", "decode"):
        assert sum(ops[phase, op] for op in OPS) == pytest.approx(ops[phase, "total"])
        assert min(ops[phase, op] for op in OPS) >= 0
    assert summary["decode_over_prefill"] > 1


def test_iteration_sweep_reports_one_prediction_per_token_count(llm):
    _, tables = measurement("iteration_sweep")(_cfg(seq_len=40), llm)
    total = tables["sweep"].query("op == 'total'").set_index("tokens").ms
    assert sorted(total.index) == [8, 16, 17, 24, 32, 33, 40]
    assert total.to_dict() == pytest.approx({n: _forward_ms(llm, prefills=[(n, n)]) for n in total.index})


def test_piggyback_derives_the_speedup_from_three_predicted_iterations(llm):
    summary, _ = measurement("piggyback")(_cfg(batch_size=3, seq_len=40, chunk=16), llm)
    decode_only = _forward_ms(llm, decodes=[40] * 3)
    alone, hybrid = _forward_ms(llm, prefills=[(16, 16)]), _forward_ms(llm, prefills=[(16, 16)], decodes=[40] * 2)
    assert summary["baseline_ms_per_decode"] == pytest.approx(decode_only / 3)
    assert summary["piggybacked_ms_per_decode"] == pytest.approx((hybrid - alone) / 2)


def test_piggyback_with_tile_aligned_chunks_fills_whole_tiles():
    # chunk 16 with 2 riding decodes overflows the 16-token tile; aligned by the run's own scheduler
    # (scheduler.chunk_align=tile, scheduler.tile=16), the chunk is 14 and the hybrid iteration exactly one tile.
    llm = LLM("tiny", executor="sim", sim_device="a6000", sim_cost_model="roofline", num_kv_blocks=64, seed=0,
              chunk_size=16, max_batch_size=3, chunk_align="tile", tile=16)
    summary, tables = measurement("piggyback")(_cfg(batch_size=3, seq_len=40, chunk=16), llm)
    table = tables["piggyback"].set_index("iteration")
    assert table.tokens.to_dict() == {"decode_only": 3, "chunk_alone": 14, "hybrid": 16}
    assert set(table.chunk_align) == {"tile"}
    alone, hybrid = _forward_ms(llm, prefills=[(14, 14)]), _forward_ms(llm, prefills=[(14, 14)], decodes=[40] * 2)
    assert summary["piggybacked_ms_per_decode"] == pytest.approx((hybrid - alone) / 2)


def test_reread_predicts_attention_and_serves_the_request_on_the_virtual_clock(llm):
    summary, tables = measurement("reread")(_cfg(seq_len=80, chunk=16, measure={"reps": 1}), llm)
    prompt, _ = split_length(80, 4.0)
    cm, layers = llm.engine.executor.cost_model, llm.model_config.num_hidden_layers
    whole = cm.iteration_cost([(prompt, prompt)]).ops["prefill_attention"] / layers * 1e3
    attention = tables["overhead"].set_index("component")
    assert attention.whole_ms["attention"] == pytest.approx(whole)
    assert summary["num_chunks"] == -(-prompt // 16) and summary["kv_reread_ratio"] > 1
    assert summary["prefill_slowdown"] > 1


def test_the_readers_take_the_alignment_a_piggyback_run_recorded(tmp_path):
    # A sweep's override column says what was asked (scheduler.chunk_align); the table's chunk_align says
    # what ran: sarathi_serve has no such knob and runs its chunk as set, whatever ++ added.
    from sarathi_lab.analysis import quantities
    from sarathi_lab.harness.compose import run_in_process
    from sarathi_lab.harness.results import load_runs

    common = ["task=piggyback", "executor=sim", "model=tiny", "logger=none", "chunk=32", "batch_size=4",
              "seq_len=64", "measure.reps=1"]
    for name, asked in (("sarathi", ["scheduler.chunk_align=tile", "scheduler.tile=16"]),
                        ("sarathi_serve", ["++scheduler.chunk_align=tile"])):
        assert run_in_process([*common, f"scheduler={name}", *asked], tmp_path / name) == "ok"
    runs = load_runs(tmp_path, "piggyback")
    assert set(runs["scheduler.chunk_align"]) == {"tile"}
    chunks = runs[runs.iteration == "chunk_alone"].set_index("scheduler")
    # (32 + 3) // 16 * 16 - 3 = 29: chunk + 3 decodes fill two 16-token tiles.
    assert chunks.tokens.to_dict() == {"sarathi": 29, "sarathi_serve": 32}
    assert chunks.chunk_align.to_dict() == {"sarathi": "tile", "sarathi_serve": "none"}
    assert sorted(quantities.decode_speedup(runs).chunk_align) == ["none", "tile"]
