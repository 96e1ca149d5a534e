"""The GEMM tile an iteration's tokens are computed in, and the chunk that fills whole tiles: the one
home of SARATHI's chunk alignment, used by the ``sarathi`` scheduler (``chunk_align``), task=piggyback
(aligned by the run's ``scheduler.chunk_align``), the simulator's tile study and the analysis."""
from __future__ import annotations

# The GEMM tile, in tokens, of the GPUs the papers ran on: SARATHI sizes its chunks by it (Fig. 7).
GEMM_TILE = 128


def aligned_chunk(chunk: int, decodes: int, tile: int = GEMM_TILE) -> int:
    """The largest chunk whose tokens with ``decodes`` riding decodes fill whole ``tile``-token tiles
    and do not exceed ``chunk + decodes``: SARATHI keeps chunk + decodes a multiple of the tile, since
    one token past it costs a whole tile of GEMM work (Fig. 7). ValueError when no multiple of the
    tile within ``chunk + decodes`` leaves room for a chunk (the decodes alone reach it)."""
    total = (chunk + decodes) // tile * tile
    if total - decodes < 1:
        raise ValueError(f"chunk + decodes = {chunk} + {decodes} = {chunk + decodes} tokens rounded down to whole "
                         f"{tile}-token tiles leaves no room for a chunk beside {decodes} decodes")
    return total - decodes
