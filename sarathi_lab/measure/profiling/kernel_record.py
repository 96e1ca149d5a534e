"""What the GPU kernel check finds, as dataclasses the GPU suite reads without torch."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AttentionCase:
    dtype: str
    head_dim: int
    heads: int
    kv_heads: int
    block_size: int
    rel_err: float
    ok: bool
    name: str = ""  # a split-KV case's description; "" for the grid's hybrid batch


@dataclass
class Verdict:
    """``what``: a KV write's block size or an elementwise kernel's name."""
    dtype: str
    what: str
    ok: bool


@dataclass
class Timing:
    case: str
    triton_ms: float
    torch_ms: float | None  # None: not timed (the KV write)
    gbps: float


@dataclass
class KernelCheck:
    device: str = ""
    attention: list[AttentionCase] = field(default_factory=list)
    kv_writes: list[Verdict] = field(default_factory=list)
    pointwise: list[Verdict] = field(default_factory=list)
    timed_case: str = ""
    timed_dtype: str = ""
    copy_gbps: float | None = None
    timings: list[Timing] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in (*self.attention, *self.kv_writes, *self.pointwise))

    @classmethod
    def from_dict(cls, raw: dict) -> KernelCheck:
        return cls(raw["device"], [AttentionCase(**c) for c in raw["attention"]],
                   [Verdict(**v) for v in raw["kv_writes"]],
                   [Verdict(**v) for v in raw["pointwise"]], raw["timed_case"], raw["timed_dtype"],
                   raw["copy_gbps"], [Timing(**t) for t in raw["timings"]])
