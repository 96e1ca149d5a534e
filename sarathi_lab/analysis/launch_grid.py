"""The iterations the launch step times and their record names, read back by the attribution."""
from __future__ import annotations

from sarathi_lab.engine.tiles import aligned_chunk

# (chunk tokens, decodes): 18 requests is the paper's batch; the tile-aligned scheduler's chunks
# beside 17 decodes where they differ; each chunk its prompt's last, so it samples.
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
# The dry run's: these iterations on the tiny model, at the shortest context fitting them.
SHAPES = {"cuda": ("llama-13b", "bfloat16", 1024, 20, CASES),
          "cpu": ("tiny", "float32", max(CHUNKS), 1, CASES)}
# The chunking claims' 3K, beside SHAPES' own.
MORE_CONTEXTS = {"cuda": (3072,), "cpu": (2 * max(CHUNKS),)}


def label(chunk: int, decodes: int, context: int | None = None) -> str:
    """``b=18``, or ``c=256+b=17`` with a chunk; ``,ctx=3072`` at a context other than SHAPES'."""
    name = f"c={chunk}+b={decodes}" if chunk else f"b={decodes}"
    return name if context is None else f"{name},ctx={context}"


def engine_ms(metrics: dict[str, float], key: str) -> float | None:
    """The forward as the engine ran it (its graph's replay where it holds one): ``engine_ms[key]``;
    older leases recorded it, for decodes only, as ``graph_ms[key]``."""
    return metrics.get(f"graph_ms[{key}]", metrics.get(f"engine_ms[{key}]"))
