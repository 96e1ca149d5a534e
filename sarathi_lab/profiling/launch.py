"""How much of a decode forward is the host launching kernels one by one: the same prepared decode
batch timed eagerly and replayed from a CUDA graph of that forward (what vLLM and nano-vllm do for
decode). The engine itself is unchanged; this measures what graphs would win. The GPU suite's
``launch`` step runs it; the simulator's fidelity check reads what it found."""
from __future__ import annotations

import torch

from sarathi_lab.engine.timer import median_time
from sarathi_lab.profiling.batches import SyntheticBatches

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


def measure(llm, batch_size: int, context: int, reps: int, graphs: bool) -> dict[str, float | str]:
    """Milliseconds of one eager forward of a decode batch of ``llm`` (an LLM) and, with ``graphs``, of
    its graph's replay, with the largest relative difference between the two outputs."""
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
