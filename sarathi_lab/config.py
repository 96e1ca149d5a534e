"""The engine's configuration: one typed dataclass, checked once at the edge.

A bad value fails before any work with one line naming the key, the value and what is allowed.
"""
from __future__ import annotations

import dataclasses
import functools
import warnings
from dataclasses import dataclass

import torch

from sarathi_lab.attention import ATTENTION_CHOICES
from sarathi_lab.engine.scheduler import scheduler_names

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
DEVICES = ("auto", "cpu", "cuda")
CPU_LINEARS = ("onednn", "aten")
EXECUTORS = ("model", "sim")
SIM_COST_MODELS = ("roofline", "profile")


class ConfigError(ValueError):
    """A configuration value that is not allowed; the message is one line: key, value, allowed."""


@dataclass
class EngineConfig:
    model: str = "tiny"
    scheduler: str = "sarathi"
    # Prefill chunk of `sarathi` (one chunk per iteration).
    chunk_size: int = 512
    # Per-iteration token budget of `sarathi_serve`, decodes included; None: the same as chunk_size.
    token_budget: int | None = None
    max_batch_size: int = 8
    device: str = "auto"
    dtype: str = "bfloat16"
    seed: int = 0
    block_size: int = 16
    # KV capacity: an explicit block count wins over a memory budget; with neither, enough for
    # max_batch_size requests of max_model_len tokens (the paper's preallocation), capped by memory.
    num_kv_blocks: int | None = None
    kv_cache_gb: float | None = None
    attention: str = "auto"
    max_model_len: int | None = None
    # Forward passes run before a generate call's clock starts (kernel warm-up, allocator growth).
    warmup_iters: int = 2
    num_threads: int | None = None
    # CPU linear layers: "onednn" packs each weight once for oneDNN's matmul (faster from 2 rows up,
    # twice the weights' memory; see model/cpu_linear.py), "aten" keeps F.linear (MKL).
    cpu_linear: str = "onednn"
    # What runs a scheduled batch: "model" (the real forward pass on `device`) or "sim" (no weights:
    # a cost model predicts each iteration's time on `sim_device` and a virtual clock advances by it).
    executor: str = "model"
    sim_device: str = "h100"
    sim_cost_model: str = "roofline"

    def __post_init__(self):
        for f in dataclasses.fields(self):
            _check_type(f.name, getattr(self, f.name), f.type)
        _check_choice("scheduler", self.scheduler, scheduler_names())
        _check_choice("device", self.device, DEVICES)
        _check_choice("dtype", self.dtype, tuple(DTYPES))
        _check_choice("attention", self.attention, ATTENTION_CHOICES)
        _check_choice("cpu_linear", self.cpu_linear, CPU_LINEARS)
        _check_choice("executor", self.executor, EXECUTORS)
        _check_choice("sim_cost_model", self.sim_cost_model, SIM_COST_MODELS)
        for key in ("chunk_size", "max_batch_size", "block_size"):
            _check_positive(key, getattr(self, key))
        for key in ("token_budget", "num_kv_blocks", "kv_cache_gb", "max_model_len", "num_threads"):
            if getattr(self, key) is not None:
                _check_positive(key, getattr(self, key))
        if self.warmup_iters < 0:
            raise ConfigError(f"warmup_iters={self.warmup_iters} is invalid: must be >= 0")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device='cuda' is invalid: no CUDA device is available; allowed here: auto, cpu")

    @property
    def budget(self) -> int:
        """sarathi_serve's per-iteration token budget."""
        return self.chunk_size if self.token_budget is None else self.token_budget

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype the engine runs in. bfloat16 on a CPU without bf16 matrix instructions
        (AVX512-BF16 or AMX) falls back to float32 with a warning: there bf16 matmuls run about 10x
        slower than float32, which would distort every prefill/decode cost ratio."""
        if self.dtype == "bfloat16" and self.torch_device.type == "cpu" and not cpu_has_bf16_units():
            warnings.warn("dtype='bfloat16' falls back to float32: this CPU has no bf16 matrix instructions",
                          stacklevel=2)
            return torch.float32
        return DTYPES[self.dtype]


@functools.cache
def cpu_has_bf16_units() -> bool:
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def _check_type(key: str, value, annotation: str) -> None:
    allowed = {"str": (str,), "int": (int,), "int | None": (int, type(None)),
               "float | None": (int, float, type(None))}[annotation]
    if isinstance(value, bool) or not isinstance(value, allowed):
        raise ConfigError(f"{key}={value!r} is invalid: must be of type {annotation}")


def _check_choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is invalid: allowed values are {', '.join(allowed)}")


def _check_positive(key: str, value) -> None:
    if value <= 0:
        raise ConfigError(f"{key}={value!r} is invalid: must be > 0")
