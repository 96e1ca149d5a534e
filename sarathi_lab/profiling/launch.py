"""How much of a forward is the host launching kernels one by one, and what the engine makes of it: the
same prepared batch (decode-only, or a prompt's last chunk alone or beside decodes: SARATHI's hybrid)
timed eagerly (the runner's forward) and as the engine runs it (its executor's forward: the replay of
the engine's own CUDA graph that holds the batch, padded to that graph's size, where one does),
interleaved. The GPU suite's ``launch`` step runs it; the simulator's fidelity check reads what it found."""
from __future__ import annotations

import statistics

from sarathi_lab.engine.tiles import aligned_chunk
from sarathi_lab.engine.timer import interleaved
from sarathi_lab.profiling.batches import SyntheticBatches

# The iterations timed, as (chunk tokens, decodes): decode-only batches of 1 and 18, chunks of 64-512
# tokens alone and beside 17 decodes (18 requests: the paper's batch), and the chunks the tile-aligned
# scheduler (scheduler.chunk_align=tile) gives beside 17 decodes, where they differ (239 for 256: two
# whole tiles); each chunk the last one of its prompt, so that it samples.
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
# model, dtype, context (each decode's, and the prompt whose last chunk runs: the paper's length),
# timed repeats, the iterations; the dry run's are the same iterations on the tiny model, at the
# shortest context that holds the largest chunk.
SHAPES = {"cuda": ("llama-13b", "bfloat16", 1024, 20, CASES),
          "cpu": ("tiny", "float32", max(CHUNKS), 1, CASES)}
# The longer contexts every case runs at too (the chunking claims' 3K), beside SHAPES' own.
MORE_CONTEXTS = {"cuda": (3072,), "cpu": (2 * max(CHUNKS),)}


def label(chunk: int, decodes: int, context: int | None = None) -> str:
    """How an iteration is named in the step's metrics: ``b=18``, or ``c=256+b=17`` with a chunk, at
    SHAPES' context; ``c=256+b=17,ctx=3072`` at another ``context``."""
    name = f"c={chunk}+b={decodes}" if chunk else f"b={decodes}"
    return name if context is None else f"{name},ctx={context}"


def measure(llm, chunk: int, decodes: int, context: int, reps: int) -> dict[str, float]:
    """Milliseconds of one forward of ``llm`` (an LLM) over the last ``chunk`` tokens of a ``context``-token
    prompt (none if 0) beside ``decodes`` decodes of ``context`` tokens: eager and as the engine runs it,
    medians of ``reps`` interleaved rounds; the tokens of the engine's graph that replayed it (0: it ran
    eagerly), and the largest relative difference between the two outputs."""
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
