"""The GPU suite's ``launch`` step: ``profiling.launch`` on LLaMA-13B's decode batches, each beside the
floor of reading weights and KV cache at the copy bandwidth the env step measured."""
from __future__ import annotations

from sarathi_lab import LLM
from sarathi_lab.gpu.context import Context
from sarathi_lab.gpu.state import Metric
from sarathi_lab.gpu.steps.env import ceilings
from sarathi_lab.model.shape import Shape
from sarathi_lab.profiling.floors import floor
from sarathi_lab.profiling.launch import SHAPES, measure


def run(ctx: Context, step) -> tuple[list[Metric], list[str]]:
    model, dtype, sizes, context, reps = SHAPES[ctx.device]
    llm = LLM(model=model, dtype=dtype, device=ctx.device, max_batch_size=max(sizes), max_model_len=context, seed=0)
    shape, elem = Shape.of(llm.model_config), llm.dtype.itemsize
    env = ceilings(ctx.out)
    graphs = ctx.device == "cuda"
    metrics = []
    for b in sizes:
        row = measure(llm, b, context, reps, graphs)
        graphs = graphs and "graph_error" not in row  # a failed capture can leave the context unusable
        metrics.append(Metric(f"eager_ms[b={b}]", round(row["eager_ms"], 3), "ms"))
        if env:
            least = floor(shape, [1] * b, [context] * b, b, elem, env["copy_gbps"], env["matmul_tflops"] * 1e3)
            metrics.append(Metric(f"floor_ms[b={b}]", round(least.seconds * 1e3, 3), "ms"))
        if "graph_error" in row:
            metrics.append(Metric(f"graph_captured[b={b}]", row["graph_error"], "", "captured", False))
        elif "graph_ms" in row:
            metrics += [Metric(f"graph_ms[b={b}]", round(row["graph_ms"], 3), "ms"),
                        Metric(f"eager_over_graph[b={b}]", round(row["eager_ms"] / row["graph_ms"], 2), "x"),
                        Metric(f"graph_rel_diff[b={b}]", float(f"{row['graph_rel_diff']:.3g}"), "", "< 0.01",
                               row["graph_rel_diff"] < 0.01)]
    notes = [f"{model} {dtype} on {ctx.device}: decode batches {', '.join(map(str, sizes))} at context {context}, "
             f"median of {reps}" + ("" if graphs else "; no CUDA graphs on the CPU (eager only)")]
    return metrics, notes
