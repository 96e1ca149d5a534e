"""The kernel configurations tuned on a GPU (the suite's ``tune`` step), one JSON table per device in
``sarathi_lab/tuned/`` named by the device's name, as vLLM ships its per-device kernel configs. What
the engine reads: per attention work kind, the tile config; per projection shape and token count,
cuBLAS or the Triton split-K GEMM and its config; the split-KV rule's knobs fitted to the device's
measured split counts (the knobs it moved). A device without a table, or a key a table lacks, gets today's defaults: the
kernels' own choices, split_rule's rule and cuBLAS.

Plain data here (no Triton, no kernel launches): the attention backend and the model's layers turn entries
into launches; the ``tune`` step writes tables through ``TunedTable.to_json``.
"""
from __future__ import annotations

import functools
import json
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

TABLE_DIR = Path(__file__).resolve().parent / "tuned"
WORK_KINDS = ("prefill", "decode")
GEMM_KERNELS = ("cublas", "triton")


@dataclass(frozen=True)
class TileConfig:
    """Paged attention's tiling for one work kind; None: the kernel's own default."""

    block_m: int | None = None
    block_n: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None

    def launch_kwargs(self) -> dict[str, int]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class GemmChoice:
    """The GEMM of one projection shape at one token count: cuBLAS, or the Triton split-K GEMM with
    this tiling (sarathi_kernels.gemm.GemmConfig's fields)."""

    kernel: str = "cublas"
    block_m: int = 64
    block_n: int = 128
    block_k: int = 64
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3

    def config_kwargs(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "kernel"}


def gemm_key(n: int, k: int, gated: bool) -> str:
    """A projection's weight [n, k] as the table names it; ``gated``: SiLU(gate) * up fused after it."""
    return f"{n}x{k}" + ("+silu_mul" if gated else "")


@dataclass(frozen=True)
class TunedTable:
    device: str = ""
    attention: dict[str, TileConfig] = field(default_factory=dict)
    # gemm_key -> {token count -> choice}
    gemm: dict[str, dict[int, GemmChoice]] = field(default_factory=dict)
    source: str = ""  # where it came from: a file, or "" for the defaults
    # The split rule's knobs the device moved from split_rule.py's defaults (the attention backend
    # builds the rule from them, which checks their ranges).
    split_rule: dict[str, int | float] = field(default_factory=dict)
    # Hybrid shapes timed co-scheduled and sequential (attention/co_schedule.py reads and checks them);
    # none: the engine never co-schedules.
    co_schedule: list[dict] = field(default_factory=list)

    def tiles(self, kind: str) -> TileConfig:
        return self.attention.get(kind, TileConfig())

    def gemm_for(self, n: int, k: int, m: int, gated: bool = False) -> GemmChoice:
        """The choice tuned at the nearest token count at or below ``m`` (the smallest tuned one below
        them all); cuBLAS where the shape was never tuned."""
        by_m = self.gemm.get(gemm_key(n, k, gated))
        if not by_m:
            return GemmChoice()
        below = [t for t in by_m if t <= m]
        return by_m[max(below) if below else min(by_m)]

    def to_json(self) -> dict:
        out = {"device": self.device, "attention": {k: asdict(v) for k, v in self.attention.items()},
               "gemm": {key: {str(m): asdict(c) if c.kernel != "cublas" else {"kernel": "cublas"}
                              for m, c in sorted(by_m.items())} for key, by_m in self.gemm.items()}}
        out |= {"co_schedule": list(self.co_schedule)} if self.co_schedule else {}
        return out | ({"split_rule": dict(self.split_rule)} if self.split_rule else {})


DEFAULT = TunedTable()


def file_name(device_name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``NVIDIA_H100_80GB_HBM3.json`` (vLLM's naming)."""
    return device_name.replace(" ", "_").replace("/", "_") + ".json"


def _fail(path: Path, key: str, value, allowed: str):
    raise ValueError(f"error: {path}: {key}={value!r} is invalid; allowed: {allowed}")


def _ints(path: Path, where: str, raw: dict, cls) -> dict:
    names = {f.name for f in fields(cls)}
    for key, value in raw.items():
        if key not in names:
            _fail(path, f"{where}.{key}", value, ", ".join(sorted(names)))
        if key != "kernel" and not (value is None or (isinstance(value, int) and value > 0)):
            _fail(path, f"{where}.{key}", value, "a positive integer" + (" or null" if cls is TileConfig else ""))
    return raw


def load(path: Path) -> TunedTable:
    """A table file, checked: a wrong key or value fails in one line naming it."""
    raw = json.loads(path.read_text())
    attention = {}
    for kind, tiles in raw.get("attention", {}).items():
        if kind not in WORK_KINDS:
            _fail(path, f"attention.{kind}", tiles, ", ".join(WORK_KINDS))
        attention[kind] = TileConfig(**_ints(path, f"attention.{kind}", tiles, TileConfig))
    gemm = {}
    for key, by_m in raw.get("gemm", {}).items():
        gemm[key] = {}
        for m, choice in by_m.items():
            if not m.isdigit():
                _fail(path, f"gemm.{key}.{m}", choice, "a token count")
            if choice.get("kernel", "cublas") not in GEMM_KERNELS:
                _fail(path, f"gemm.{key}.{m}.kernel", choice.get("kernel"), ", ".join(GEMM_KERNELS))
            gemm[key][int(m)] = GemmChoice(**_ints(path, f"gemm.{key}.{m}", choice, GemmChoice))
    return TunedTable(raw.get("device", ""), attention, gemm, str(path), _split_rule(path, raw.get("split_rule", {})),
                      raw.get("co_schedule", []))


def _split_rule(path: Path, raw: dict) -> dict[str, int | float]:
    if not isinstance(raw, dict):
        _fail(path, "split_rule", raw, "a mapping of the split rule's knobs to numbers")
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            _fail(path, f"split_rule.{key}", value, "a number")
    return dict(raw)


@functools.cache
def table_named(device_name: str, table_dir: Path = TABLE_DIR) -> TunedTable:
    """The table of the device so named, or DEFAULT where it has none."""
    path = table_dir / file_name(device_name)
    return load(path) if path.is_file() else DEFAULT


# Tables put in force by ``using``, innermost last.
_USING: list[TunedTable] = []


@contextmanager
def using(table: TunedTable):
    """Every device runs ``table`` inside the block: the tune step measures a candidate through the
    engine's own code path, and a CPU test sees an entry picked up without a GPU."""
    _USING.append(table)
    try:
        yield table
    finally:
        _USING.pop()


def table_for(device: torch.device) -> TunedTable:
    """The table in force (``using``), else a CUDA device's own; DEFAULT elsewhere (no table is tuned for
    a CPU's interpreter)."""
    if _USING:
        return _USING[-1]
    if device.type != "cuda":
        return DEFAULT
    return _cuda_table(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_table(index: int) -> TunedTable:
    # Asked per linear layer and attention call: the device's name once.
    return table_named(torch.cuda.get_device_name(index), TABLE_DIR)
