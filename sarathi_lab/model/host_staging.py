"""The pinned host memory an iteration's inputs pass through on their way to a CUDA device.

Pinned (page-locked) memory lets the copy run asynchronously, by the GPU's copy engine, while the
host goes on to launch the forward pass; from pageable memory the driver first copies into a
pinned bounce buffer of its own, synchronously. One buffer of bytes, which an iteration's int64 and
int32 inputs share so that they go over in one copy, grown when an iteration needs more and reused
by every later one, as vLLM's and nano-vllm's runners keep theirs.
"""
from __future__ import annotations

import torch


class HostStaging:
    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None
        # Recorded after the last copy out of the buffer: it must have finished before the buffer
        # is written again. The engine's own loop has waited for it by then (it reads each
        # iteration's tokens back before preparing the next); a caller that prepares twice in a
        # row would otherwise overwrite inputs still being copied.
        self._copied: torch.cuda.Event | None = None

    def buffer(self, nbytes: int) -> torch.Tensor:
        """The first ``nbytes`` bytes of the buffer (uint8), free to write."""
        if self._copied is not None:
            self._copied.synchronize()
            self._copied = None
        buf = self._buffer
        if buf is None or buf.numel() < nbytes:
            size = max(nbytes, 2 * (0 if buf is None else buf.numel()), 1 << 16)
            # Pinned only where CUDA is: pinning needs its driver.
            buf = self._buffer = torch.empty(size, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        return buf[:nbytes]

    def copied(self) -> None:
        """The copy out of the buffer is queued: writes must wait for it."""
        if torch.cuda.is_available():
            self._copied = torch.cuda.Event()
            self._copied.record()
