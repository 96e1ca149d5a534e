"""How much of a forward is the host launching kernels one by one: the same batch timed eagerly and
as the engine runs it (its CUDA graph's replay, padded to the graph, where one holds it),
interleaved. The GPU suite's ``launch`` step runs it over the iterations of
analysis/launch_grid.py."""
from __future__ import annotations

import statistics

from sarathi_lab.engine.timer import interleaved
from sarathi_lab.measure.profiling.batches import SyntheticBatches


def measure(llm, chunk: int, decodes: int, context: int, reps: int) -> dict[str, float]:
    """Eager and engine ms (interleaved medians), graph tokens (0: eager), outputs' difference."""
    executor, clock = llm.engine.executor, llm.engine.clock
    runner = executor.runner
    batches = SyntheticBatches(llm, seed=0)
    with batches.made([(chunk, context - chunk)] if chunk else [], decodes, context) as batch:
        prepared = runner.prepare(batch)
        # Each also the untimed first call: kernels compiled, the graph's buffers touched.
        eager = runner.forward(prepared).float()
        engine = executor.forward(prepared).float()
        graph = executor.graphs.graph_for(prepared) if executor.graphs is not None else None
        times = interleaved({"eager": lambda: runner.forward(prepared),
                             "engine": lambda: executor.forward(prepared)},
                            reps, clock)
    return {"eager_ms": statistics.median(times["eager"][:, 0]) * 1e3,
            "engine_ms": statistics.median(times["engine"][:, 0]) * 1e3,
            "graph_tokens": graph.tokens if graph is not None else 0,
            "rel_diff": float((engine - eager).abs().max() / eager.abs().max().clamp_min(1e-30))}
