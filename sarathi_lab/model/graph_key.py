"""The key of a captured forward in cuda_graphs.py's table, whole or cut (nano_graphs.py)."""
from __future__ import annotations

from typing import NamedTuple


class Graph(NamedTuple):
    decode: bool
    tokens: int
    requests: int
    prefill_tiles: object = None  # a cut graph's: its two nano-batches' (nano_graphs.py)
    pod: bool = False
    cut: int = 0  # the first nano-batch's tokens; 0: the batch runs whole
