"""The pinned host buffer an iteration's inputs pass through to a CUDA device: from pinned memory the
copy runs asynchronously while the host launches the forward. One buffer, shared by the int64 and int32
inputs so that they go in one copy, grown as needed and reused, as vLLM's and nano-vllm's runners do."""
from __future__ import annotations

import torch


class HostStaging:
    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None
        # The last copy out of the buffer, which must finish before it is written again (a caller
        # that prepares twice in a row would otherwise overwrite inputs still being copied).
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
