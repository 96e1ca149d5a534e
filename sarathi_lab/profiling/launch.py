"""How much of a decode forward is the host launching kernels one by one: the same prepared decode
batch timed eagerly and replayed from a CUDA graph of that forward (what vLLM and nano-vllm do for
decode). It captures the batch as it is, a hybrid too, beside the engine's own decode graphs (which
its LLM leaves out: cuda_graphs=False); this measures what graphs win. The GPU suite's
``launch`` step runs it; the simulator's fidelity check reads what it found."""
from __future__ import annotations

from sarathi_lab.engine.timer import median_time
from sarathi_lab.model.cuda_graphs import capture_cuda_graph
from sarathi_lab.profiling.batches import SyntheticBatches

# model, dtype, context per decode (the paper's length), timed repeats, and the iterations timed as
# (chunk tokens, decodes), the chunk a whole prompt: decode-only batches of 1 and 18, and SARATHI's
# hybrid, a 256-token chunk beside 17 decodes.
SHAPES = {"cuda": ("llama-13b", "bfloat16", 1024, 20, ((0, 1), (0, 18), (256, 17))),
          "cpu": ("tiny", "float32", 32, 3, ((0, 1), (0, 2), (16, 1)))}


def label(chunk: int, decodes: int) -> str:
    """How an iteration is named in the step's metrics: ``b=18``, or ``c=256+b=17`` with a chunk."""
    return f"c={chunk}+b={decodes}" if chunk else f"b={decodes}"


def measure(llm, chunk: int, decodes: int, context: int, reps: int, graphs: bool) -> dict[str, float | str]:
    """Milliseconds of one eager forward of ``llm`` (an LLM) over a prompt of ``chunk`` tokens (none
    if 0) beside ``decodes`` decodes of ``context`` tokens and, with ``graphs``, of its graph's
    replay, with the largest relative difference between the two outputs."""
    runner, clock = llm.engine.executor.runner, llm.engine.clock
    batches = SyntheticBatches(llm, seed=0)
    batch = batches.make(prefills=[(chunk, 0)] if chunk else [], decodes=decodes, context=context)
    try:
        prepared = runner.prepare(batch)
        eager = runner.forward(prepared).float()
        row = {"eager_ms": median_time(lambda: runner.forward(prepared), reps, clock) * 1e3}
        if graphs:
            try:
                replay, out, _ = capture_cuda_graph(lambda: runner.forward(prepared))
            except Exception as e:  # noqa: BLE001 - a forward that cannot be captured is the finding
                return row | {"graph_error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
            replay()
            row["graph_ms"] = median_time(replay, reps, clock) * 1e3
            row["graph_rel_diff"] = float((out.float() - eager).abs().max() / eager.abs().max().clamp_min(1e-30))
    finally:
        batches.free(batch)
    return row
