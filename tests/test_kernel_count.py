"""Kernels a decoder layer launches on the GPU path, counted statically from the engine's own decisions
(measure/profiling/kernel_count.py): the fusions take RoPE + KV write from two launches to one and, where the
tuned table chose the Triton GEMM for gate_up, SiLU * up into its epilogue; a split attention or a
split-K GEMM adds its merge. The ``launch`` step reports the counts before and after."""
from __future__ import annotations

from sarathi_lab.measure.gpu import state
from sarathi_lab.measure.gpu.context import Context
from sarathi_lab.measure.gpu.plan import BY_NAME
from sarathi_lab.measure.profiling.kernel_count import static_layer_kernels
from sarathi_lab.model.presets import PRESETS
from sarathi_lab.model.shape import Shape
from sarathi_lab.tuned_kernels import DEFAULT, GemmChoice, TunedTable, gemm_key

LLAMA_13B = Shape.of(PRESETS["llama-13b"])


def count(table=DEFAULT, fused=True, tokens=273, requests=18, max_query_len=256, num_sms=132):
    return static_layer_kernels(LLAMA_13B, tokens, requests, max_query_len, 1024, fused_rope=fused, table=table,
                                num_sms=num_sms)


def test_today_s_layer_is_ten_kernels_and_the_rope_fusion_takes_one_off():
    before = count(fused=False)
    assert before == ["add_rms_norm", "qkv_proj", "rope", "write_kv", "paged_attention", "o_proj", "add_rms_norm",
                      "gate_up_proj", "silu_mul", "down_proj"]
    assert len(count()) == 9 and "rope_write_kv" in count()


def test_a_tuned_gated_gemm_takes_the_activation_and_a_split_k_its_reduce():
    gate_up = gemm_key(2 * 13824, 5120, True)
    fused = TunedTable(gemm={gate_up: {256: GemmChoice("triton")}})
    assert len(count(fused)) == 8 and "gate_up_proj+silu_mul" in count(fused) and "silu_mul" not in count(fused)
    split = TunedTable(gemm={gemm_key(5120, 5120, False): {256: GemmChoice("triton", split_k=3)}})
    assert count(split).count("o_proj.split_k_reduce") == 1 and len(count(split)) == 10


def test_a_lone_decode_on_132_sms_splits_and_pays_a_merge():
    assert "merge_splits" in count(tokens=1, requests=1, max_query_len=1)
    assert "merge_splits" not in count(tokens=1, requests=1, max_query_len=1, num_sms=None)


def test_the_launch_step_reports_kernels_per_layer_before_and_after(tmp_path, monkeypatch):
    from sarathi_lab.measure.gpu.steps import launch

    monkeypatch.setattr("sarathi_lab.measure.profiling.launch.measure", lambda llm, chunk, decodes, context, reps: {
        "eager_ms": 2.0, "engine_ms": 1.0, "graph_tokens": 0, "rel_diff": 0.0})
    ctx = Context(tmp_path, state.step_dir(tmp_path, "launch"), True, "cpu", None)
    metrics, notes = launch.run(ctx, BY_NAME["launch"])
    by_name = {m.metric: m.value for m in metrics}
    for key in ("c=256+b=17", "b=18"):
        # The CPU has no table: the RoPE fusion only.
        assert by_name[f"kernels_per_layer_before[{key}]"] == 10 and by_name[f"kernels_per_layer_after[{key}]"] == 9
        assert f"kernels_per_layer_profiled_after[{key}]" not in by_name  # a CUDA profile only
    assert any("rope_write_kv" in n for n in notes)
