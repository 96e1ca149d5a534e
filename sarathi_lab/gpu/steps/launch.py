"""How much of a decode forward is the host launching kernels one by one: the same prepared decode
batch of LLaMA-13B timed eagerly and replayed from a CUDA graph of that forward (what vLLM and
nano-vllm do for decode), each beside the floor of reading weights and KV cache at the copy
bandwidth the env step measured. The engine itself is unchanged; this measures what graphs would win."""
from __future__ import annotations

import torch

from sarathi_lab import LLM
from sarathi_lab.engine.timer import median_time
from sarathi_lab.gpu.context import Context
from sarathi_lab.gpu.state import Metric
from sarathi_lab.gpu.steps.env import ceilings
from sarathi_lab.model.shape import Shape
from sarathi_lab.profiling.batches import SyntheticBatches
from sarathi_lab.profiling.floors import floor

# model, dtype, decode batch sizes, context per request (the paper's length), timed repeats.
SHAPES = {"cuda": ("llama-13b", "bfloat16", (1, 18), 1024, 20), "cpu": ("tiny", "float32", (1, 2), 32, 3)}


def _graphed(runner, prepared) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """A CUDA graph of one forward of ``prepared`` and its output tensor, captured as PyTorch's
    documentation says: warm-up forwards on a side stream first."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            runner.forward(prepared)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = runner.forward(prepared)
    return graph, out


def measure(llm: LLM, batch_size: int, context: int, reps: int, graphs: bool) -> dict[str, float | str]:
    """Milliseconds of one eager forward of a decode batch and, with ``graphs``, of its graph's replay,
    with the largest relative difference between the two outputs."""
    runner, clock = llm.engine.executor.runner, llm.engine.clock
    batches = SyntheticBatches(llm, seed=0)
    batch = batches.make(decodes=batch_size, context=context)
    try:
        prepared = runner.prepare(batch)
        eager = runner.forward(prepared).float()
        row = {"eager_ms": median_time(lambda: runner.forward(prepared), reps, clock) * 1e3}
        if graphs:
            try:
                graph, out = _graphed(runner, prepared)
            except Exception as e:  # noqa: BLE001 - a forward that cannot be captured is the finding
                return row | {"graph_error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
            graph.replay()
            row["graph_ms"] = median_time(graph.replay, reps, clock) * 1e3
            row["graph_rel_diff"] = float((out.float() - eager).abs().max() / eager.abs().max().clamp_min(1e-30))
    finally:
        batches.free(batch)
    return row


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
