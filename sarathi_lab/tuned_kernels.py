"""Kernel configs tuned on a GPU, a JSON table per device (as vLLM ships them); else defaults."""
from __future__ import annotations

import functools
import json
import logging
import re
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

log = logging.getLogger(__name__)

TABLE_DIR = Path(__file__).resolve().parent / "tuned"
WORK_KINDS = ("prefill", "decode")
GEMM_KERNELS = ("cublas", "triton")


@dataclass(frozen=True)
class TileConfig:
    """None: the kernel's own default."""

    block_m: int | None = None
    block_n: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None

    def launch_kwargs(self) -> dict[str, int]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class GemmChoice:

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
    """``gated``: SiLU(gate) * up fused after it."""
    return f"{n}x{k}" + ("+silu_mul" if gated else "")


@dataclass(frozen=True)
class TunedTable:
    device: str = ""
    attention: dict[str, TileConfig] = field(default_factory=dict)
    # gemm_key -> {token count -> choice}
    gemm: dict[str, dict[int, GemmChoice]] = field(default_factory=dict)
    source: str = ""
    split_rule: dict[str, int | float] = field(default_factory=dict)
    # Hybrid shapes timed both ways; none: the engine never co-schedules.
    co_schedule: list[dict] = field(default_factory=list)
    # Nano-batch overlap (OVERLAP_FIELDS); a field absent: model/nano_batch.py's default.
    overlap: dict[str, bool | int] = field(default_factory=dict)

    def tiles(self, kind: str) -> TileConfig:
        return self.attention.get(kind, TileConfig())

    def gemm_for(self, n: int, k: int, m: int, gated: bool = False) -> GemmChoice:
        """The nearest tuned count at or below ``m`` (else the smallest); cuBLAS if never tuned."""
        by_m = self.gemm.get(gemm_key(n, k, gated))
        if not by_m:
            return GemmChoice()
        below = [t for t in by_m if t <= m]
        return by_m[max(below) if below else min(by_m)]

    def to_json(self) -> dict:
        out = {"device": self.device,
               "attention": {k: asdict(v) for k, v in self.attention.items()},
               "gemm": {key: {str(m): asdict(c) if c.kernel != "cublas" else {"kernel": "cublas"}
                              for m, c in sorted(by_m.items())}
                        for key, by_m in self.gemm.items()}}
        out |= {"co_schedule": list(self.co_schedule)} if self.co_schedule else {}
        out |= {"overlap": dict(self.overlap)} if self.overlap else {}
        return out | ({"split_rule": dict(self.split_rule)} if self.split_rule else {})


DEFAULT = TunedTable()


def file_name(device_name: str) -> str:
    """vLLM's naming: ``NVIDIA_H100_80GB_HBM3.json``."""
    return device_name.replace(" ", "_").replace("/", "_") + ".json"


# {field: (allowed, as refusals say it, check)}: no table hands a kernel an uncompiled size.
def _pow2(v) -> bool:
    return 16 <= v <= 256 and v & (v - 1) == 0


_POW2 = ("a power of two in [16, 256]", _pow2)
_WARPS = ("one of 1, 2, 4, 8, 16", lambda v: v in (1, 2, 4, 8, 16))
_STAGES = ("an integer in [1, 8]", lambda v: 1 <= v <= 8)
_LAUNCH = {"block_m": _POW2, "block_n": _POW2, "block_k": _POW2, "num_warps": _WARPS,
           "num_stages": _STAGES, "split_k": ("an integer in [1, 64]", lambda v: 1 <= v <= 64)}
MAX_TOKENS = 1 << 20
MAX_KNOB = 1e6
GEMM_KEY = re.compile(r"[1-9][0-9]{0,6}x[1-9][0-9]{0,6}(\+silu_mul)?")
TOP_KEYS = ("device", "attention", "gemm", "split_rule", "co_schedule", "overlap")
OVERLAP_FIELDS = {"enabled": ("true or false", lambda v: isinstance(v, bool)),
                  "min_tokens": (f"an integer in [1, {MAX_TOKENS}]",
                                 lambda v: type(v) is int and 1 <= v <= MAX_TOKENS)}
CO_SCHEDULE_FIELDS = ("heads", "kv_heads", "chunk", "decodes", "context", "over_sequential")


class TableRefused(ValueError):
    """One line naming the file and field."""


def _fail(source: str, key: str, value, allowed: str):
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    key = key if key.isprintable() else repr(key)[1:-1]
    raise TableRefused(f"error: {source}: {key}={shown} is invalid; allowed: {allowed}")


def _mapping(source: str, key: str, raw) -> dict:
    if not isinstance(raw, dict):
        _fail(source, key, raw, "a mapping")
    return raw


def _launch(source: str, where: str, raw, cls) -> dict:
    """``cls``'s fields only, each an int (never a bool) in range; null for TileConfig's default."""
    names = [f.name for f in fields(cls)]
    for key, value in _mapping(source, where, raw).items():
        if key not in names:
            _fail(source, f"{where}.{key}", value, ", ".join(names))
        if key == "kernel":
            if value not in GEMM_KERNELS:
                _fail(source, f"{where}.{key}", value, ", ".join(GEMM_KERNELS))
            continue
        allowed, ok = _LAUNCH[key]
        if value is None and cls is TileConfig:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not ok(value):
            null = " or null" if cls is TileConfig else ""
            _fail(source, f"{where}.{key}", value, allowed + null)
    return raw


def _split_rule(source: str, raw) -> dict[str, int | float]:
    """Finite numbers only; split_rule.py checks names and ranges (falling back if it refuses)."""

    for key, value in _mapping(source, "split_rule", raw).items():
        number = not isinstance(value, bool) and isinstance(value, int | float)
        if not number or not 0 <= value <= MAX_KNOB:
            _fail(source, f"split_rule.{key}", value, f"a number in [0, {MAX_KNOB:g}]")
    return dict(raw)


def _gemm(source: str, raw) -> dict[str, dict[int, GemmChoice]]:
    gemm = {}
    for key, by_m in _mapping(source, "gemm", raw).items():
        if not GEMM_KEY.fullmatch(key):
            _fail(source, f"gemm.{key}", by_m, "a weight shape NxK, +silu_mul where gated")
        gemm[key] = {}
        for m, choice in _mapping(source, f"gemm.{key}", by_m).items():
            if not (m.isdecimal() and m.isascii() and 1 <= int(m) <= MAX_TOKENS):
                _fail(source, f"gemm.{key}.{m}", choice, f"a token count in [1, {MAX_TOKENS}]")
            gemm[key][int(m)] = GemmChoice(**_launch(source, f"gemm.{key}.{m}", choice, GemmChoice))
    return gemm


def parse(raw, source: str, device: str | None = None) -> TunedTable:
    for key, value in _mapping(source, "the table", raw).items():
        if key not in TOP_KEYS:
            _fail(source, key, value, ", ".join(TOP_KEYS))
    name = raw.get("device", "")
    if not isinstance(name, str) or (device is not None and name != device):
        _fail(source, "device", name, repr(device) if device is not None else "a GPU's name")
    attention = {}
    for kind, tiles in _mapping(source, "attention", raw.get("attention", {})).items():
        if kind not in WORK_KINDS:
            _fail(source, f"attention.{kind}", tiles, ", ".join(WORK_KINDS))
        attention[kind] = TileConfig(**_launch(source, f"attention.{kind}", tiles, TileConfig))
    return TunedTable(name, attention, _gemm(source, raw.get("gemm", {})), source,
                      _split_rule(source, raw.get("split_rule", {})),
                      co_schedule_entries(source, raw.get("co_schedule", [])),
                      overlap_entry(source, raw.get("overlap", {})))


def overlap_entry(source: str, raw) -> dict[str, bool | int]:
    """Whether nano-batch overlap runs on the device and from how many tokens; each field optional."""
    for key, value in _mapping(source, "overlap", raw).items():
        if key not in OVERLAP_FIELDS:
            _fail(source, f"overlap.{key}", value, ", ".join(OVERLAP_FIELDS))
        allowed, ok = OVERLAP_FIELDS[key]
        if not ok(value):
            _fail(source, f"overlap.{key}", value, allowed)
    return dict(raw)


def co_schedule_entries(source: str, raw) -> list[dict]:
    listed = ", ".join(CO_SCHEDULE_FIELDS)
    if not isinstance(raw, list):
        _fail(source, "co_schedule", raw, f"a list of entries with {listed}")
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict) or set(entry) != set(CO_SCHEDULE_FIELDS):
            _fail(source, f"co_schedule[{i}]", entry, f"exactly the keys {listed}")
        for key, value in entry.items():
            whole = key != "over_sequential"
            if (isinstance(value, bool) or not isinstance(value, int if whole else int | float)
                    or not 0 < value <= (MAX_TOKENS if whole else MAX_KNOB)):
                _fail(source, f"co_schedule[{i}].{key}", value,
                      "a positive " + ("integer" if whole else "number"))
    return list(raw)


def from_bytes(data: bytes, source: str, device: str | None = None) -> TunedTable:
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise TableRefused(f"error: {source}: not a JSON table ({type(e).__name__})") from None
    return parse(raw, source, device)


def load(path: Path, device: str | None = None) -> TunedTable:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TableRefused(f"error: {path}: unreadable ({type(e).__name__})") from None
    return from_bytes(data, str(path), device)


@functools.cache
def table_named(device_name: str, table_dir: Path = TABLE_DIR) -> TunedTable:
    """DEFAULT where there is none, or (with a warning) a damaged one: it never stops the engine."""
    path = table_dir / file_name(device_name)
    if not path.is_file():
        return DEFAULT
    try:
        return load(path, device_name)
    except TableRefused as e:
        log.warning("%s; running the kernels' defaults", e)
        return DEFAULT


# Tables put in force by ``using``, innermost last.
_USING: list[TunedTable] = []


@contextmanager
def using(table: TunedTable):
    """The tune step measures a candidate through the engine's own path."""
    _USING.append(table)
    try:
        yield table
    finally:
        _USING.pop()


def table_for(device: torch.device) -> TunedTable:

    if _USING:
        return _USING[-1]
    if device.type != "cuda":
        return DEFAULT
    return _cuda_table(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_table(index: int) -> TunedTable:
    # Asked per linear layer and attention call: the device's name once.
    return table_named(torch.cuda.get_device_name(index), TABLE_DIR)
