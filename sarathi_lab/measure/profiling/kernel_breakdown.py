"""Where an iteration's GPU time goes as the engine runs it: the profiler's kernels of
``executor.execute``, grouped by name and place in the layer (a replay records no
``record_function`` ranges), beside the forward's CUDA-event time and the wall time."""
from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass

import torch

from sarathi_lab.measure.profiling.batches import SyntheticBatches

PROJECTIONS = ("qkv", "o", "gate_up", "down")
# In the order a figure stacks them; the first ten run in every decoder layer. ``gemm``: a GEMM
# whose projection its place could not tell.
GROUPS = (*(f"gemm.{p}" for p in PROJECTIONS), "attention.chunk", "attention.decode",
          "attention.merge", "norm", "rope_kv", "activation", "lm_head", "sampling", "gemm",
          "other")
LAYER_GROUPS = GROUPS[:10]
# A kernel's lower-cased name to what it computes, the first substring that matches (SDPA's before
# the GEMMs: flash's names carry "cutlass"); else other.
KINDS = (
    ("_add_rms_norm_kernel", "norm"), ("_rope_write_kv_kernel", "rope_kv"),
    ("_rope_kernel", "rope_kv"), ("_write_kv_kernel", "rope_kv"),
    ("_silu_mul_kernel", "activation"), ("_merge_splits_kernel", "merge"),
    ("_paged_attention_kernel", "attention"), ("_pod_attention_kernel", "attention"),
    ("_gemm_kernel", "gemm"), ("_reduce_kernel", "gemm.reduce"),
    ("flash_fwd_splitkv_combine", "merge"), ("flash_fwd", "attention"), ("fmha", "attention"),
    ("sdpa", "attention"), ("splitkreduce", "gemm.reduce"), ("nvjet", "gemm"), ("gemm", "gemm"),
    ("gemv", "gemm"), ("cutlass", "gemm"), ("_linear_pointwise", "gemm"),
    ("argmax", "sampling"), ("softmax", "sampling"), ("topk", "sampling"),
    ("multinomial", "sampling"), ("sort", "sampling"),
    ("silu", "activation"), ("rsqrt", "norm"),
)


def kind_of(name: str) -> str:
    lowered = name.lower()
    return next((kind for pattern, kind in KINDS if pattern in lowered), "other")


@dataclass(frozen=True)
class Kernel:
    name: str
    start_us: float
    duration_us: float


def groups_of(names: list[str], layers: int, chunk: bool) -> list[str]:
    """Norm j of 2 * layers + 1 opens qkv (even j), gate_up (odd j) or the LM head (the last);
    where the norms do not count out, every GEMM is ``gemm``."""
    kinds = [kind_of(n) for n in names]
    per = 2 * layers + 1
    norms = kinds.count("norm")
    anchored = norms > 0 and norms % per == 0
    groups, seen, phase, calls = [], 0, None, 0
    for kind in kinds:
        if kind == "norm":
            j, seen, calls = seen % per, seen + 1, 0
            phase = "lm_head" if j == per - 1 else "qkv" if j % 2 == 0 else "gate_up"
        elif kind in ("attention", "merge") and phase == "qkv":
            phase = "o"
        elif kind == "activation" and phase == "gate_up":
            phase = "down"
        if kind in ("gemm", "gemm.reduce"):
            if kind == "gemm":
                phase = "down" if phase == "gate_up" and calls else phase
                calls += 1
            groups.append("gemm" if not anchored or phase is None else
                          "lm_head" if phase == "lm_head" else f"gemm.{phase}")
        elif kind == "attention":
            groups.append("attention.chunk" if chunk else "attention.decode")
        else:
            groups.append("attention.merge" if kind == "merge" else kind)
    return groups


def breakdown_rows(iteration: str, kernels: list[Kernel], iterations: int, layers: int, chunk: bool,
                   gpu_ms: float, wall_ms: float, source: str) -> list[dict]:
    """One row a group that ran, with the kernel sum, forward event and wall time."""
    ordered = sorted(kernels, key=lambda k: k.start_us)
    count, total_us = defaultdict(int), defaultdict(float)
    for k, group in zip(ordered, groups_of([k.name for k in ordered], layers, chunk)):
        count[group] += 1
        total_us[group] += k.duration_us
    whole_ms = sum(total_us.values()) / iterations / 1e3
    rows = []
    for group in (g for g in GROUPS if g in count):
        ms = total_us[group] / iterations / 1e3
        rows.append({"iteration": iteration, "group": group, "kernels": count[group] / iterations,
                     "total_ms": ms, "per_layer_ms": ms / layers if group in LAYER_GROUPS else None,
                     "share": ms / whole_ms if whole_ms else None, "iteration_kernels_ms": whole_ms,
                     "iteration_gpu_ms": gpu_ms, "iteration_wall_ms": wall_ms, "source": source})
    return rows


def kernels_of(prof, cuda: bool) -> list[Kernel]:
    """Off CUDA the outermost CPU ops (the CPU path's C++ kernels show in none)."""
    from torch.autograd import DeviceType

    if cuda:
        events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    else:
        events = [e for e in prof.events() if e.device_type == DeviceType.CPU
                  and e.cpu_parent is None]
    return [Kernel(e.name, e.time_range.start, e.time_range.elapsed_us()) for e in events]


def profile_iteration(llm, chunk: int, decodes: int, context: int,
                      reps: int) -> tuple[list[Kernel], float, float]:
    """``reps`` profiled iterations, then forward event and wall ms of ``reps`` more."""
    from torch.profiler import ProfilerActivity, profile

    executor = llm.engine.executor
    cuda = executor.runner.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with SyntheticBatches(llm, seed=0).made([(chunk, context - chunk)] if chunk else [], decodes,
                                            context) as batch:
        executor.execute(batch)
        sync()
        with profile(activities=activities) as prof:
            for _ in range(reps):
                executor.execute(batch)
            sync()
        gpu, wall = [], []
        for _ in range(reps):
            start = time.perf_counter()
            out = executor.execute(batch)
            sync()
            wall.append(time.perf_counter() - start)
            gpu.append(out.forward_s)
    return kernels_of(prof, cuda), statistics.median(gpu) * 1e3, statistics.median(wall) * 1e3
