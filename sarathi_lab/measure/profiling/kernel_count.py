"""Kernels a decoder layer launches on the GPU path, before and after the fusions: a static count
from the engine's own decisions (runs anywhere), and on CUDA a torch profiler count of an eager
forward. The GPU suite's ``launch`` step reports both."""
from __future__ import annotations

from collections import Counter
from contextlib import nullcontext

import torch

from sarathi_lab.measure.profiling.batches import SyntheticBatches
from sarathi_lab.model.shape import Shape
from sarathi_lab.tuned_kernels import DEFAULT, TunedTable, table_for, using

STAGES = ("before", "after")


def static_layer_kernels(shape: Shape, tokens: int, requests: int, max_query_len: int,
                         max_seq_len: int, *, fused_rope: bool, table: TunedTable,
                         num_sms: int | None, elem_bytes: int = 2) -> list[str]:
    """In order, for a batch of ``tokens`` in ``requests`` on the Triton path."""
    from sarathi_kernels.attention_plan import plan_launch

    def projection(name: str, gated: bool = False) -> list[str]:
        k, n = shape.gemms[name]
        choice = table.gemm_for(n, k, tokens, gated)
        if choice.kernel != "triton":
            return [name] + (["silu_mul"] if gated else [])
        launch = [f"{name}+silu_mul" if gated else name]
        return launch + ([f"{name}.split_k_reduce"] if choice.split_k > 1 else [])

    kind = "decode" if max_query_len == 1 else "prefill"
    plan = plan_launch(tokens, requests, shape.heads, shape.kv_heads, max_seq_len=max_seq_len,
                       element_size=elem_bytes, max_query_len=max_query_len, num_sms=num_sms,
                       **table.tiles(kind).launch_kwargs())
    kernels = ["add_rms_norm", *projection("qkv_proj")]
    kernels += ["rope_write_kv"] if fused_rope else ["rope", "write_kv"]
    kernels += ["paged_attention"] + (["merge_splits"] if plan.num_splits > 1 else [])
    kernels += [*projection("o_proj"), "add_rms_norm", *projection("gate_up_proj", shape.gated),
                *projection("down_proj")]
    return kernels


def stage(llm, name: str):
    """``before`` the fusions (default table, separate SiLU * up) or ``after`` them."""
    backend = getattr(llm.model, "backend", None)
    if hasattr(backend, "fuse_rope"):
        backend.fuse_rope = name == "after"
    return using(DEFAULT) if name == "before" else nullcontext()


def profiled_layer_kernels(llm, chunk: int, decodes: int, context: int) -> dict[str, int]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    runner, layers = llm.engine.executor.runner, llm.model_config.num_hidden_layers
    batches = SyntheticBatches(llm, seed=0)
    batch = batches.make(prefills=[(chunk, context - chunk)] if chunk else [], decodes=decodes,
                         context=context)
    counts = {}
    try:
        prepared = runner.prepare(batch)
        for name in STAGES:
            with stage(llm, name):
                runner.forward(prepared)  # compiles outside the profile
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    runner.forward(prepared)
                    torch.cuda.synchronize()
            kernels = Counter(e.name for e in prof.events() if e.device_type == DeviceType.CUDA
                              and not e.name.startswith(("Memcpy", "Memset")))
            counts[name] = sum(n // layers for n in kernels.values())
    finally:
        stage(llm, "after")
        batches.free(batch)
    return counts


def static_counts(llm, chunk: int, decodes: int, context: int,
                  device: torch.device) -> dict[str, list[str]]:
    from sarathi_kernels.occupancy import device_sm_count

    shape = Shape.of(llm.model_config)
    requests, tokens = decodes + (chunk > 0), chunk + decodes
    return {name: static_layer_kernels(shape, tokens, requests, chunk or 1, context,
                                       fused_rope=name == "after",
                                       table=DEFAULT if name == "before" else table_for(device),
                                       num_sms=device_sm_count(device),
                                       elem_bytes=llm.dtype.itemsize)
            for name in STAGES}
