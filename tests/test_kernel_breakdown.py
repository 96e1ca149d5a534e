"""The per-kernel breakdown of an iteration as the engine runs it (measure/profiling/kernel_breakdown.py): kernel
names as an H100 trace of a CUDA-graph replay has them, grouped by what they compute and, for the GEMMs,
by the projection their place in the layer says they are (a replay records no ranges); summed per
iteration and per layer; the launch step's kernels.csv and its figure."""
from __future__ import annotations

import pandas as pd
import pytest

from sarathi_lab.measure.profiling.kernel_breakdown import GROUPS, Kernel, breakdown_rows, groups_of, kind_of

NORM, ROPE_KV, ATTENTION, MERGE, SILU = ("_add_rms_norm_kernel", "_rope_write_kv_kernel", "_paged_attention_kernel",
                                         "_merge_splits_kernel", "_silu_mul_kernel")
QKV = "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT"
O_PROJ = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_"
          "kernel__5x_cublas")
SPLIT_K = ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, "
           "false>(cublasLt::cublasSplitKParams<float>, float const*, __nv_bfloat16 const*, __nv_bfloat16*, float "
           "const*, float const*, __nv_bfloat16 const*, __nv_bfloat16 const*, __nv_bfloat16*, void*, long, float*, "
           "int*)")
GATE_UP = "nvjet_tst_256x128_64x4_1x2_h_bz_coopA_TNT"
DOWN = ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(cutlass_80_tensor"
        "op_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)")
LM_HEAD = ("void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 4, 4, false, false, "
           "cublasGemvParamsEx<int, __nv_bfloat16 const*, __nv_bfloat16 const*, __nv_bfloat16, float> >(cublasGemvPa"
           "ramsEx<int, __nv_bfloat16 const*, __nv_bfloat16 const*, __nv_bfloat16, float>, float, float)")
EMBED = ("void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, "
         "true>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<c10::BFloat16 "
         "const, unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, "
         "unsigned int, long)")
FILL = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>, std::array<char*, 1ul> >"
        "(int, at::native::FillFunctor<int>, std::array<char*, 1ul>)")
ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*"
       ", 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)")
ARGMAX = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, at::native::ArgMaxOps<c10::"
          "BFloat16>, unsigned int, long, 4> >(at::native::ReduceOp<c10::BFloat16, at::native::ArgMaxOps<c10::BFloat16"
          ">, unsigned int, long, 4>)")


def decode_iteration(layers: int) -> list[str]:
    """A decode batch's replay: the prologue's fill and input copy, the embedding, each layer (a split
    attention with its merge, o_proj split-K on cuBLASLt), the final add and norm, the LM head, argmax."""
    layer = [NORM, QKV, ROPE_KV, ATTENTION, MERGE, O_PROJ, SPLIT_K, NORM, GATE_UP, SILU, DOWN]
    return ["Memcpy HtoD (Pinned -> Device)", FILL, EMBED, *layer * layers, ADD, NORM, LM_HEAD, ARGMAX,
            "Memcpy DtoH (Device -> Pageable)"]


def test_h100_kernel_names_fall_in_their_groups():
    groups = groups_of(decode_iteration(2), layers=2, chunk=False)
    layer = ["norm", "gemm.qkv", "rope_kv", "attention.decode", "attention.merge", "gemm.o", "gemm.o", "norm",
             "gemm.gate_up", "activation", "gemm.down"]
    assert groups == ["other", "other", "other", *layer * 2, "other", "norm", "lm_head", "sampling", "other"]
    assert set(groups) <= set(GROUPS)
    # The same attention kernel over a batch with a chunk is the chunk's work.
    assert "attention.chunk" in groups_of(decode_iteration(2), layers=2, chunk=True)


def test_a_gated_triton_gemm_then_its_down_projection_split_k():
    # gate_up with SiLU * up in its epilogue (no activation kernel), down split-K with its reduce.
    layer = [NORM, "_gemm_kernel", ROPE_KV, ATTENTION, "_gemm_kernel", NORM, "_gemm_kernel", "_gemm_kernel",
             "_reduce_kernel"]
    groups = groups_of([*layer, NORM, "_gemm_kernel"], layers=1, chunk=True)
    assert groups == ["norm", "gemm.qkv", "rope_kv", "attention.chunk", "gemm.o", "norm", "gemm.gate_up",
                      "gemm.down", "gemm.down", "norm", "lm_head"]


@pytest.mark.parametrize("name, kind", [
    (("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
     "cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, "
     "false, false, false, true, false, false>(pytorch_flash::Flash_fwd_params)"), "attention"),
    (("void pytorch_flash::flash_fwd_splitkv_combine_kernel<pytorch_flash::Flash_fwd_kernel_traits<128, 64, 128, 4, "
     "false, false, cutlass::bfloat16_t>, 4, 3, true>(pytorch_flash::Flash_fwd_params)"), "merge"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x128x128_4x1x1_kernel0_0", "attention"),
    (("fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
     "cutlass::arch::Sm80, true, 64, 128, 128, true, true>::Params)"), "attention"),
    (("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous "
     "namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)"), "sampling"),
    (("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::silu_kernel(at::Tensor"
     "Iterator&)::{lambda()#1}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, "
     "std::array<char*, 2ul> >(int, at::native::(anonymous namespace)::silu_kernel(at::TensorIterator&)::{lambda()"
     "#1}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>)"),
     "activation"),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn", "gemm"),
    ("Memset (Device)", "other"),
])
def test_peers_and_torch_kernels(name, kind):
    assert kind_of(name) == kind


def test_where_the_norms_do_not_count_out_gemms_are_not_guessed():
    names = decode_iteration(2)[:-6]   # the final norm and LM head cut off: 4 norms, not 5
    groups = groups_of(names, layers=2, chunk=False)
    assert "gemm" in groups and not any(g.startswith("gemm.") for g in groups)


def test_rows_sum_per_iteration_and_per_layer():
    names = decode_iteration(2) * 2       # two iterations profiled back to back
    kernels = [Kernel(n, float(i), 10.0) for i, n in enumerate(names)]
    rows = {r["group"]: r for r in breakdown_rows("b=18", kernels[::-1], 2, 2, False, 0.4, 0.5, "cuda kernels")}
    per_iteration = len(decode_iteration(2)) * 10.0 / 1e3
    assert rows["norm"]["kernels"] == 5 and rows["norm"]["total_ms"] == pytest.approx(0.05)
    assert rows["gemm.o"]["kernels"] == 4 and rows["gemm.o"]["per_layer_ms"] == pytest.approx(0.02)
    assert rows["lm_head"]["per_layer_ms"] is None and rows["sampling"]["kernels"] == 1
    assert sum(r["share"] for r in rows.values()) == pytest.approx(1.0)
    assert all(r["iteration_kernels_ms"] == pytest.approx(per_iteration) for r in rows.values())
    assert list(rows) == [g for g in GROUPS if g in rows]   # in GROUPS' order
    assert {r["iteration_gpu_ms"] for r in rows.values()} == {0.4}


def test_the_figure_draws_a_stacked_bar_per_iteration(tmp_path):
    from sarathi_lab.measure.gpu import state
    from sarathi_lab.measure.gpu.steps.launch import KERNELS, figure

    kernels = [Kernel(n, float(i), 10.0) for i, n in enumerate(decode_iteration(40))]
    rows = breakdown_rows("b=18", kernels, 1, 40, False, 5.0, 5.6, "cuda kernels")
    rows += breakdown_rows("c=256+b=17", kernels, 1, 40, True, 4.8, 5.0, "cuda kernels")
    folder = state.step_dir(tmp_path, "launch")
    folder.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(folder / KERNELS, index=False)
    assert figure(tmp_path) and (tmp_path / "figures" / "kernel_breakdown.png").is_file()


def test_the_launch_steps_dry_run_writes_the_breakdown(tmp_path, monkeypatch):
    from sarathi_lab.measure.gpu import state
    from sarathi_lab.measure.gpu.context import Context
    from sarathi_lab.measure.gpu.plan import BY_NAME
    from sarathi_lab.measure.gpu.steps import launch

    model, dtype, context, reps, _ = launch.SHAPES["cpu"]
    monkeypatch.setitem(launch.SHAPES, "cpu", (model, dtype, context, reps, ((0, 18), (256, 17))))
    monkeypatch.setattr("sarathi_lab.measure.profiling.launch.measure", lambda llm, chunk, decodes, context, reps: {
        "eager_ms": 2.0, "engine_ms": 1.0, "graph_tokens": 0, "rel_diff": 0.0})
    ctx = Context(tmp_path, state.step_dir(tmp_path, "launch"), True, "cpu", None)
    ctx.dir.mkdir(parents=True)
    metrics, notes = launch.run(ctx, BY_NAME["launch"])
    table = pd.read_csv(ctx.dir / launch.KERNELS)
    assert list(table.columns) == ["iteration", "group", "kernels", "total_ms", "per_layer_ms", "share",
                                   "iteration_kernels_ms", "iteration_gpu_ms", "iteration_wall_ms", "source"]
    assert list(dict.fromkeys(table.iteration)) == ["b=18", "c=256+b=17"] and set(table.group) <= set(GROUPS)
    assert table.source.str.startswith("cpu ops").all()   # no CUDA kernels off the GPU: host ops
    assert table.groupby("iteration").share.sum().round(6).eq(1.0).all()
    by_name = {m.metric: m for m in metrics}
    assert by_name["kernel_sum_over_gpu_event[c=256+b=17]"].holds is None     # judged on a GPU only
    assert {"kernel_sum_ms[b=18]", "iteration_host_ms[b=18]"} <= set(by_name)
    assert any(n.startswith("per-kernel breakdown (kernels.csv)") for n in notes)


def test_a_profile_that_fails_leaves_the_step_standing(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from sarathi_lab.measure.gpu.steps import launch

    def profile(llm, chunk, decodes, context, reps):
        if chunk:
            raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")
        names = decode_iteration(2) * reps   # the profile holds reps iterations
        return [Kernel(n, float(i), 10.0) for i, n in enumerate(names)], 1.0, 1.2

    monkeypatch.setattr("sarathi_lab.measure.profiling.kernel_breakdown.profile_iteration", profile)
    llm = SimpleNamespace(model_config=SimpleNamespace(num_hidden_layers=2))
    metrics, note = launch._kernel_breakdown(llm, ((0, 18), (256, 17)), 1024, tmp_path, "cuda")
    assert "not profiled: c=256+b=17 (RuntimeError: CUPTI_ERROR_NOT_INITIALIZED)" in note
    assert set(pd.read_csv(tmp_path / launch.KERNELS).iteration) == {"b=18"}
    by_name = {m.metric: m for m in metrics}
    # 30 kernels of 10 us less the argmax's, over a forward of 1 ms on the GPU's events.
    assert by_name["kernel_sum_over_gpu_event[b=18]"].value == pytest.approx(0.29)
    assert by_name["kernel_sum_over_gpu_event[b=18]"].holds is False
