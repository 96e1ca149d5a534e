"""The link between two processes of one machine as a table of one-way times by message size
(measure/profiling/link.py measures it), linear between sizes. Not latency + bytes / bandwidth: over
loopback TCP a 64 KiB message can take about what a megabyte takes."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Link:
    """Beyond the largest size, the last two sizes' slope (never below the largest's time)."""
    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        n = len(self.sizes)
        if n < 2 or n != len(self.seconds) or list(self.sizes) != sorted(set(self.sizes)):
            raise ValueError(f"a link needs two or more increasing sizes, each with its seconds: "
                             f"{self.sizes}, {self.seconds}")

    @classmethod
    def linear(cls, latency_s: float, bandwidth: float) -> Link:
        return cls((0, 1 << 20), (latency_s, latency_s + (1 << 20) / bandwidth))

    def message_s(self, nbytes: float) -> float:
        sizes, seconds = self.sizes, self.seconds
        if nbytes <= sizes[-1]:
            return float(np.interp(nbytes, sizes, seconds))
        slope = (seconds[-1] - seconds[-2]) / (sizes[-1] - sizes[-2])
        return seconds[-1] + max(slope, 0.0) * (nbytes - sizes[-1])

    def describe(self) -> str:
        return (f"{self.seconds[0] * 1e6:.0f} us ({self.sizes[0]} B) to "
                f"{self.seconds[-1] * 1e6:.0f} us ({self.sizes[-1] / 2**20:g} MiB) a message")
