"""How much of a forward is the host launching kernels one by one: the same batch timed eagerly and
as the engine runs it (its CUDA graph's replay, padded to the graph, where one holds it),
interleaved. The GPU suite's ``launch`` step runs it."""
from __future__ import annotations

import statistics

from sarathi_lab.engine.tiles import aligned_chunk
from sarathi_lab.engine.timer import interleaved
from sarathi_lab.measure.profiling.batches import SyntheticBatches

# (chunk tokens, decodes): 18 requests is the paper's batch; the tile-aligned scheduler's chunks
# beside 17 decodes where they differ; each chunk its prompt's last, so that it samples.
CHUNKS = (64, 128, 256, 512)
DECODES = 17


def _aligned(chunk: int) -> int | None:
    try:
        return aligned_chunk(chunk, DECODES)
    except ValueError:  # the decodes alone fill the chunk's tiles: the scheduler keeps the chunk
        return None


ALIGNED = tuple(a for a in dict.fromkeys(map(_aligned, CHUNKS)) if a is not None
                and a not in CHUNKS)
CASES = (((0, 1), (0, DECODES + 1))
         + tuple((chunk, decodes) for chunk in CHUNKS for decodes in (0, DECODES))
         + tuple((chunk, DECODES) for chunk in ALIGNED))
# The dry run's: the same iterations on the tiny model, at the shortest context holding the largest
# chunk.
SHAPES = {"cuda": ("llama-13b", "bfloat16", 1024, 20, CASES),
          "cpu": ("tiny", "float32", max(CHUNKS), 1, CASES)}
# The chunking claims' 3K, beside SHAPES' own.
MORE_CONTEXTS = {"cuda": (3072,), "cpu": (2 * max(CHUNKS),)}


def label(chunk: int, decodes: int, context: int | None = None) -> str:
    """``b=18``, or ``c=256+b=17`` with a chunk; ``,ctx=3072`` at a context other than SHAPES'."""
    name = f"c={chunk}+b={decodes}" if chunk else f"b={decodes}"
    return name if context is None else f"{name},ctx={context}"


def measure(llm, chunk: int, decodes: int, context: int, reps: int) -> dict[str, float]:
    """Eager and engine ms (medians of ``reps`` interleaved rounds), the engine graph's tokens (0:
    eager), and the outputs' largest relative difference."""
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
