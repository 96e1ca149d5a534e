"""The GEMM tile and the chunk that fills whole tiles: the one home of SARATHI's chunk alignment."""
from __future__ import annotations

# The papers' GPUs' GEMM tile, in tokens: SARATHI sizes its chunks by it (Fig. 7).
GEMM_TILE = 128


def aligned_chunk(chunk: int, decodes: int, tile: int = GEMM_TILE) -> int:
    """The largest chunk keeping chunk + decodes a tile multiple (Fig. 7); ValueError if none."""
    total = (chunk + decodes) // tile * tile
    if total - decodes < 1:
        raise ValueError(f"chunk + decodes = {chunk} + {decodes} = {chunk + decodes} tokens "
                         f"rounded down to whole {tile}-token tiles leaves no room for a chunk "
                         f"beside {decodes} decodes")
    return total - decodes
