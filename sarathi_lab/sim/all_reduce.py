"""The tensor-parallel all-reduce of the hidden states: NCCL times measured in one DGX node
(``data/gpu_kernels/all_reduce.csv``), interpolated in the message size, or a ring's roofline,
``latency + 2 (tp - 1) / tp * bytes / bandwidth``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import pandas as pd

from sarathi_lab.sim.gpu_kernels import DATA_DIR
from sarathi_lab.sim.interpolate import Curve

ALL_REDUCE_PATH = DATA_DIR / "all_reduce.csv"


@functools.cache
def measured_table() -> pd.DataFrame:
    return pd.read_csv(ALL_REDUCE_PATH)


def measured_points(device: str, tp: int) -> dict[int, float]:
    """{message bytes: seconds} measured for ``tp`` GPUs of ``device`` in one node ({} if none)."""
    t = measured_table()
    rows = t[(t.device == device) & (t.tp == tp)]
    return dict(zip(rows["bytes"].astype(int), rows.seconds.astype(float)))


def ring_s(nbytes: float, tp: int, latency_s: float, bandwidth: float) -> float:
    """The roofline of a ring all-reduce of ``nbytes`` among ``tp`` GPUs."""
    return latency_s + 2 * (tp - 1) / tp * nbytes / bandwidth if tp > 1 else 0.0


@dataclass(frozen=True)
class AllReduce:
    """Seconds of one all-reduce of ``nbytes`` among ``tp`` GPUs: measured where ``points`` are
    given (beyond them, the ring's extra bytes), else the ring's roofline; ``describe()`` says which."""
    tp: int
    latency_s: float
    bandwidth: float
    points: tuple[tuple[int, float], ...] = ()
    source: str = ""

    @functools.cached_property
    def curve(self) -> Curve | None:
        return Curve(dict(self.points)) if self.points else None

    def roofline_s(self, nbytes: float) -> float:
        return ring_s(nbytes, self.tp, self.latency_s, self.bandwidth)

    def __call__(self, nbytes: float) -> float:
        if self.tp == 1:
            return 0.0
        c = self.curve
        if c is None:
            return self.roofline_s(nbytes)
        if nbytes > c.xs[-1]:
            return c.ys[-1] + self.roofline_s(nbytes) - self.roofline_s(c.xs[-1])
        return c(max(nbytes, c.xs[0]))[0]

    def describe(self) -> str:
        if self.curve is None:
            return (f"all-reduce of {self.tp} GPUs: the ring roofline ({self.latency_s * 1e6:g} us + "
                    f"{self.bandwidth / 1e9:g} GB/s){': ' + self.source if self.source else ''}")
        return (f"all-reduce of {self.tp} GPUs: measured ({self.source}) up to {self.curve.xs[-1] / 2**20:g} "
                "MiB a message, the ring roofline's extra bytes beyond")

    @classmethod
    def of(cls, device: str, tp: int, latency_s: float, bandwidth: float, measured: bool) -> AllReduce:
        """Measured where ``measured`` and vidur timed ``tp`` GPUs of ``device``, else the roofline."""
        points = measured_points(device, tp) if measured and tp > 1 else {}
        if points:
            return cls(tp, latency_s, bandwidth, tuple(sorted(points.items())),
                       f"vidur, {device.upper()} DGX node, NCCL")
        why = f"no all-reduce measured for {tp} x {device}" if measured and tp > 1 else ""
        return cls(tp, latency_s, bandwidth, (), why)
