"""The engine's configuration, each value checked without probing the host (the plan does)."""
from __future__ import annotations

import dataclasses
import math
import numbers
import re
import types
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from sarathi_lab.executors import ExecutorKind, executor_class, executor_names, unhonoured
from sarathi_lab.refusal import (  # noqa: F401
    AS_WRITTEN,
    UNSET,
    ConfigError,
    Key,
    Naming,
    Text,
    Words,
    Written,
    marked_as,
    named_as,
)

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent

ATTENTIONS = ("auto", "torch", "triton")
ATTENTION_HYBRIDS = ("sequential", "pod")
OVERLAPS = ("none", "nano_batch")
DTYPE_BYTES = {"bfloat16": 2, "float32": 4, "float16": 2}
DTYPES = tuple(DTYPE_BYTES)
CPU_LINEARS = ("auto", "mkl", "onednn", "aten")
# What predicts a run; "floor" bounds it from below (each kernel at the data-sheet peaks).
PREDICTING_COST_MODELS = ("roofline", "profile", "calibrated")
SIM_COST_MODELS = (*PREDICTING_COST_MODELS, "floor")
EXECUTORS = executor_names()
MAX_SEED = 2**64 - 1  # numpy's and torch's generators both take [0, 2**64)
KV_WATERMARK = 0.01  # vLLM's and sarathi-serve's default
# Past half, most of the cache idles, and the default cache, sized with it on top, grows unbounded.
MAX_KV_WATERMARK = 0.5
GPU_MEMORY_UTILISATION = 0.9  # vLLM's gpu_memory_utilization default


@dataclass(frozen=True)
class Keys:
    """How the edge names settings; ``shown``: a value as the user wrote it (token_budget=auto)."""
    names: Mapping[str, str] = field(default_factory=dict)
    prefix: str = ""
    knob_prefix: str = ""
    shown: Mapping[str, str] = field(default_factory=dict)

    def __call__(self, setting: str) -> str:
        if setting in self.names:
            return self.names[setting]
        return (self.prefix if setting in ENGINE_FIELDS else self.knob_prefix) + setting

    def show(self, setting: str, value: Any) -> str:
        return self.shown.get(setting, repr(value))




def settings_of(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.init]


@dataclass
class EngineConfig:
    model: str = "tiny"
    scheduler: str = "sarathi"
    # The run's `chunk`: sarathi's prefill chunk, sarathi_serve's token budget.
    chunk_size: int = 512
    max_batch_size: int = 8
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal[DTYPES] = "bfloat16"
    seed: int = 0
    block_size: int = 16
    # Blocks win over a budget; with neither, model/memory.py sizes it.
    num_kv_blocks: int | None = None
    kv_cache_gb: float | None = None
    kv_watermark: float = KV_WATERMARK
    attention: Literal[ATTENTIONS] = "auto"
    # "sequential" and "none" until a GPU measures the gain of the others.
    attention_hybrid: Literal[ATTENTION_HYBRIDS] = "sequential"
    overlap: Literal[OVERLAPS] = "none"
    cuda_graphs: bool = True
    cuda_graphs_mixed: bool = True
    max_model_len: int | None = None
    scheduler_knobs: dict[str, Any] = field(default_factory=dict)
    warmup_iters: int = 2
    num_threads: int | None = None
    cpu_linear: Literal[CPU_LINEARS] = "auto"
    executor: Literal[EXECUTORS] = "model"  # what each honours: executors.py
    sim_device: str = "h100"
    sim_cost_model: Literal[SIM_COST_MODELS] = "roofline"
    sim_kv_beyond_device: bool = False  # what-if sweeps past the device's memory
    sim_tp: int = 1
    sim_pp: int = 1
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    # A rank that died or hangs ends the run with an error naming it, never a hang.
    collective_timeout_s: float = 120.0

    def __post_init__(self):
        check_fields(self, positive=True, zero_ok=("warmup_iters",), skip=("seed", "kv_watermark"))
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError("seed", self.seed, "is invalid: must be in [0, 2**64 - 1]")
        if not 0 <= self.kv_watermark <= MAX_KV_WATERMARK:
            raise ConfigError("kv_watermark", self.kv_watermark,
                              f"is invalid: must be in [0, {MAX_KV_WATERMARK}] (the share of the "
                              f"KV cache admission leaves free; vLLM's is {KV_WATERMARK})")
        if bad := unhonoured(self.executor, vars(self), ENGINE_DEFAULTS):
            setting, why, allowed = bad
            raise ConfigError(setting, getattr(self, setting),
                              "is invalid with " + Key("executor", self.executor) + f": {why}",
                              allowed)
        self.kind.check_settings(self)
        if self.world_size > 1 and self.overlap != "none":
            raise ConfigError("overlap", self.overlap,
                              f"is invalid with {self.world_size} ranks ("
                              + Key("tensor_parallel") + " x " + Key("pipeline_parallel")
                              + "): they run each batch whole", "none")

    @property
    def kind(self) -> type[ExecutorKind]:
        return executor_class(self.executor)

    @property
    def world_size(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def kv_size_key(self) -> str | None:
        """num_kv_blocks wins over kv_cache_gb; None: neither."""
        if self.num_kv_blocks is not None:
            return "num_kv_blocks"
        return "kv_cache_gb" if self.kv_cache_gb is not None else None

    def explicit_kv_blocks(self, block_bytes: int) -> int | None:
        if self.kv_size_key != "kv_cache_gb":
            return self.num_kv_blocks
        blocks = int(self.kv_cache_gb * 2**30 // block_bytes)
        if blocks < 1:
            raise ConfigError("kv_cache_gb", self.kv_cache_gb,
                              f"is invalid: it holds no block of {block_bytes} bytes")
        return blocks


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'."""
    chip = re.search(r"\b([AHBL]\d{2,3}|A6000)\b", name)
    return chip[1].lower() if chip else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


ENGINE_FIELDS = frozenset(f.name for f in settings_of(EngineConfig))
ENGINE_DEFAULTS = {f.name: f.default for f in settings_of(EngineConfig)}


def attention_backend(attention: str, device_type: str) -> str:
    if attention == "auto":
        return "triton" if device_type == "cuda" else "torch"
    return attention


def check_attention_hybrid(hybrid: str, backend: str) -> None:
    if hybrid != "sequential" and backend != "triton":
        raise ConfigError("attention_hybrid", hybrid,
                          f"is invalid with the {backend} attention: it is a Triton kernel",
                          "sequential, or with " + Key("attention") + "=triton")


def check_fields(obj: Any, positive: bool = False, zero_ok: tuple[str, ...] = (),
                 skip: tuple[str, ...] = (), keys: Naming | None = None,
                 held: Collection[str] = ()) -> None:
    """Each field against its annotation (a bool is never an int); ``held``: another's; ``keys``:
    the edge's naming of them (None: the core's fields, named by a later edge)."""

    hints = get_type_hints(type(obj))
    fields = [(f.name, as_python_number(getattr(obj, f.name))) for f in settings_of(type(obj))
              if not dataclasses.is_dataclass(hints[f.name]) and f.name not in held]
    for name, value in fields:
        _check_type(name, value, hints[name], keys)
        if value is not getattr(obj, name):
            object.__setattr__(obj, name, value)
    for name, value in fields if positive else ():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and name not in skip \
                and (value < 0 or value == 0 and name not in zero_ok):
            raise ConfigError(name, value, f"is invalid: must be {'>=' if name in zero_ok else '>'} 0",
                              keys=keys)


def as_python_number(value: Any) -> Any:
    """numpy's numbers as Python's, which every setting takes."""
    if isinstance(value, (bool, int, float)):
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and type(value).__module__ == "numpy":
        return float(value)
    return value


def _check_type(setting: str, value: Any, tp: Any, keys: Naming | None = None) -> None:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return
        (inner,) = [a for a in args if a is not type(None)]
        _check_type(setting, value, inner, keys)
    elif origin is Literal:
        check_choice(setting, value, args, keys)
    elif origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(setting, value, "is invalid: must be a mapping", keys=keys)
    elif origin is list:
        if not isinstance(value, list):
            raise ConfigError(setting, value, "is invalid: must be a list", keys=keys)
        for i, item in enumerate(value):
            _check_type(f"{setting}[{i}]", item, args[0], keys)
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(setting, value, "is invalid: must be of type float", keys=keys)
        if not math.isfinite(value):
            raise ConfigError(setting, value, "is invalid: must be a finite number", keys=keys)
    elif isinstance(value, bool) and tp is not bool or not isinstance(value, tp):
        raise ConfigError(setting, value, f"is invalid: must be of type {tp.__name__}", keys=keys)


def check_choice(setting: str, value: Any, allowed: tuple, keys: Naming | None = None) -> None:
    """``keys``: as check_fields'."""
    if value not in allowed:
        raise ConfigError(setting, value,
                          f"is invalid: allowed values are {', '.join(map(str, allowed))}",
                          keys=keys)


def check_count(setting: str, value: Any, least: int, keys: Naming | None = None) -> None:
    """numpy's too; never a bool. ``keys``: as check_fields'."""

    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ConfigError(setting, value, f"is invalid: must be an integer >= {least}", keys=keys)
