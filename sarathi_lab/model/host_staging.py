"""The pinned host memory an iteration's inputs pass through on their way to a CUDA device.

Pinned (page-locked) memory lets the copy run asynchronously, by the GPU's copy engine, while the
host goes on to launch the forward pass; from pageable memory the driver first copies into a
pinned bounce buffer of its own, synchronously. One buffer per dtype, grown when an iteration needs
more and reused by every later one, as vLLM's and nano-vllm's runners keep theirs.
"""
from __future__ import annotations

import torch


class HostStaging:
    def __init__(self) -> None:
        self._buffers: dict[torch.dtype, torch.Tensor] = {}
        # Recorded after the last copies out of the buffers: they must have finished before the
        # buffers are written again (a forward pass in between waits for them, but a caller that
        # prepares twice in a row would otherwise overwrite inputs still being copied).
        self._copied: torch.cuda.Event | None = None

    def buffer(self, dtype: torch.dtype, n: int) -> torch.Tensor:
        """``n`` elements of this dtype's buffer, free to write."""
        if self._copied is not None:
            self._copied.synchronize()
            self._copied = None
        buf = self._buffers.get(dtype)
        if buf is None or buf.numel() < n:
            size = max(n, 2 * (0 if buf is None else buf.numel()), 1 << 12)
            # Pinned only where CUDA is: pinning needs its driver.
            buf = torch.empty(size, dtype=dtype, pin_memory=torch.cuda.is_available())
            self._buffers[dtype] = buf
        return buf[:n]

    def copied(self) -> None:
        """The copies out of the buffers are queued: writes must wait for them."""
        if torch.cuda.is_available():
            self._copied = torch.cuda.Event()
            self._copied.record()
