"""The GPU suite's ``launch`` step: ``profiling.launch`` on LLaMA-13B's decode batches and a hybrid one,
each beside its floor (weights, KV cache and flops at the ceilings the env step measured)."""
from __future__ import annotations

from sarathi_lab import LLM
from sarathi_lab.gpu.context import Context
from sarathi_lab.gpu.state import Metric
from sarathi_lab.gpu.steps.env import ceilings
from sarathi_lab.model.shape import Shape
from sarathi_lab.profiling.floors import floor
from sarathi_lab.profiling.launch import SHAPES, label, measure


def run(ctx: Context, step) -> tuple[list[Metric], list[str]]:
    model, dtype, context, reps, cases = SHAPES[ctx.device]
    # Its own capture of each batch below, so none of the engine's.
    llm = LLM(model=model, dtype=dtype, device=ctx.device, max_batch_size=max(d + (c > 0) for c, d in cases),
              max_model_len=context, seed=0, cuda_graphs=False)
    shape, elem = Shape.of(llm.model_config), llm.dtype.itemsize
    env = ceilings(ctx.out)
    graphs = ctx.device == "cuda"
    metrics = []
    for chunk, decodes in cases:
        row, key = measure(llm, chunk, decodes, context, reps, graphs), label(chunk, decodes)
        graphs = graphs and "graph_error" not in row  # a failed capture can leave the context unusable
        metrics.append(Metric(f"eager_ms[{key}]", round(row["eager_ms"], 3), "ms"))
        if env:
            queries, contexts = [chunk] * (chunk > 0) + [1] * decodes, [chunk] * (chunk > 0) + [context] * decodes
            least = floor(shape, queries, contexts, len(queries), elem, env["copy_gbps"], env["matmul_tflops"] * 1e3)
            metrics.append(Metric(f"floor_ms[{key}]", round(least.seconds * 1e3, 3), "ms"))
        if "graph_error" in row:
            metrics.append(Metric(f"graph_captured[{key}]", row["graph_error"], "", "captured", False))
        elif "graph_ms" in row:
            metrics += [Metric(f"graph_ms[{key}]", round(row["graph_ms"], 3), "ms"),
                        Metric(f"eager_over_graph[{key}]", round(row["eager_ms"] / row["graph_ms"], 2), "x"),
                        Metric(f"graph_rel_diff[{key}]", float(f"{row['graph_rel_diff']:.3g}"), "", "< 0.01",
                               row["graph_rel_diff"] < 0.01)]
    notes = [f"{model} {dtype} on {ctx.device}: {', '.join(label(c, d) for c, d in cases)} (c: a whole prompt's "
             f"tokens, b: decodes at context {context}), median of {reps}"
             + ("" if graphs else "; no CUDA graphs on the CPU (eager only)")]
    return metrics, notes
