"""The engine's configuration: one typed dataclass, each plain value checked without probing the
host (plan.probe_host does); a refusal names the setting as the user set it (``Keys``)."""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
import numbers
import re
import types
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from sarathi_lab.executors import ExecutorKind, executor_class, executor_names, unhonoured
from sarathi_lab.host_features import cpu_has_bf16_units, cuda_available, usable_cores  # noqa: F401
from sarathi_lab.refusal import SETTING, ConfigError, as_written, named_as, render  # noqa: F401

log = logging.getLogger("sarathi_lab")

# The package (its data ships with it) and the clone around it (docs/, profiles/, kernels/).
PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent

ATTENTIONS = ("auto", "torch", "triton")
# Prefills beside decodes: one paged kernel over both, or both co-scheduled on each SM (POD).
ATTENTION_HYBRIDS = ("sequential", "pod")
# Decode attention after the GEMMs, or overlapped with them as two nano-batches on two streams.
OVERLAPS = ("none", "nano_batch")
# Bytes per element, for torch-free sizing.
DTYPE_BYTES = {"bfloat16": 2, "float32": 4, "float16": 2}
DTYPES = tuple(DTYPE_BYTES)
CPU_LINEARS = ("auto", "mkl", "onednn", "aten")
SIM_COST_MODELS = ("roofline", "profile", "calibrated")
EXECUTORS = executor_names()
# numpy's and torch's generators both take seeds in [0, 2**64).
MAX_SEED = 2**64 - 1
# The share of KV blocks admission leaves free: vLLM's and sarathi-serve's default watermark.
KV_WATERMARK = 0.01
# Past half, most of the cache idles while requests wait, and the default cache, sized with the
# watermark on top, grows without bound as it nears 1.
MAX_KV_WATERMARK = 0.5
# vLLM's gpu_memory_utilization default.
GPU_MEMORY_UTILISATION = 0.9


@dataclass(frozen=True)
class Keys:
    """How the edge names settings: ``prefix`` + name (engine.block_size), ``knob_prefix`` + knob,
    or ``names`` (a run's chunk_size is `chunk`); ``shown``: a value as the user wrote it
    (token_budget=auto) where the engine refuses what it became."""
    names: Mapping[str, str] = field(default_factory=dict)
    prefix: str = ""
    knob_prefix: str = ""
    shown: Mapping[str, str] = field(default_factory=dict)

    def __call__(self, setting: str) -> str:
        if setting in self.names:
            return self.names[setting]
        return (self.prefix if setting in ENGINE_FIELDS else self.knob_prefix) + setting

    def set(self, setting: str, value: Any) -> str:
        """``key=value``, as a refusal begins."""
        return self._at(setting, repr(value))

    def _at(self, setting: str, shown: str) -> str:
        return f"{self(setting)}={self.shown.get(setting, shown)}"

    def render(self, text: str) -> str:
        """A core refusal with each marked setting named as the user set it."""
        return render(text, self, self._at)


# Each setting by its own name: LLM's keyword arguments, and any caller that names no other keys.
AS_WRITTEN = Keys()


def settings_of(cls: type) -> list[dataclasses.Field]:
    return list(dataclasses.fields(cls))


@dataclass
class EngineConfig:
    model: str = "tiny"
    scheduler: str = "sarathi"
    # The one home of the run's `chunk`: sarathi's prefill chunk, sarathi_serve's token budget.
    chunk_size: int = 512
    max_batch_size: int = 8
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal[DTYPES] = "bfloat16"
    seed: int = 0
    block_size: int = 16
    # KV capacity: blocks win over a memory budget; with neither, model/memory.py sizes it (vLLM's
    # rule on a GPU, the paper's preallocation on a CPU) for the engine and the simulator alike.
    num_kv_blocks: int | None = None
    kv_cache_gb: float | None = None
    # Admission leaves int(kv_watermark * blocks) free for running requests to grow into.
    kv_watermark: float = KV_WATERMARK
    attention: Literal[ATTENTIONS] = "auto"
    # "pod": hybrid batches in one persistent Triton launch sharing each SM between prefill tiles
    # and decodes; "sequential" until a GPU measures the gain.
    attention_hybrid: Literal[ATTENTION_HYBRIDS] = "sequential"
    # "nano_batch": large hybrid batches as two nano-batches, one's attention on a side stream
    # beside the other's GEMMs (eager only); "none" until a GPU measures the gain.
    overlap: Literal[OVERLAPS] = "none"
    # CUDA with Triton attention: forwards replay graphs captured at build (decodes; with
    # cuda_graphs_mixed, prefills up to a token count too); false: every forward eager.
    cuda_graphs: bool = True
    cuda_graphs_mixed: bool = True
    max_model_len: int | None = None
    # The scheduler's own knobs, checked against its Config when it is built.
    scheduler_knobs: dict[str, Any] = field(default_factory=dict)
    # Forward passes before a generate call's clock starts (kernel warm-up, allocator growth).
    warmup_iters: int = 2
    num_threads: int | None = None
    # CPU linears over packed weights: "auto" picks by CPU and rows; "aten" keeps F.linear.
    cpu_linear: Literal[CPU_LINEARS] = "auto"
    # "model": the real forward; "sim": a cost model's time on `sim_device`, a virtual clock;
    # "vllm": vLLM's own engine. What each honours: sarathi_lab/executors.py.
    executor: Literal[EXECUTORS] = "model"
    sim_device: str = "h100"
    sim_cost_model: Literal[SIM_COST_MODELS] = "roofline"
    # Lets an explicit KV cache larger than sim_device's memory run (what-if sweeps).
    sim_kv_beyond_device: bool = False
    # Tensor-parallel GPUs of sim_device serving as one, Megatron-style.
    sim_tp: int = 1
    # Pipeline stages of sim_tp GPUs each, layers split as the engine splits them.
    sim_pp: int = 1
    # Ranks the real model is split across, Megatron-style, one process each (or torchrun's).
    tensor_parallel: int = 1
    # Pipeline stages (each tensor_parallel ranks); activations go stage to stage.
    pipeline_parallel: int = 1
    # A rank that died or hangs ends the run with an error naming it, never a hang.
    collective_timeout_s: float = 120.0

    def __post_init__(self):
        k = SETTING
        check_fields(self, positive=True, zero_ok=("warmup_iters",), skip=("seed", "kv_watermark"),
                     keys=k)
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"{k.set('seed', self.seed)} is invalid: must be in [0, 2**64 - 1]")
        if not 0 <= self.kv_watermark <= MAX_KV_WATERMARK:
            raise ConfigError(f"{k.set('kv_watermark', self.kv_watermark)} is invalid: must be "
                              f"in [0, {MAX_KV_WATERMARK}] (the share of the KV cache admission "
                              f"leaves free; vLLM's is {KV_WATERMARK})")
        if bad := unhonoured(self.executor, vars(self), ENGINE_DEFAULTS):
            setting, why, allowed = bad
            raise ConfigError(f"{k.set(setting, getattr(self, setting))} is invalid with "
                              f"{k.set('executor', self.executor)}: {why}; allowed: {allowed}")
        if self.kind.simulated:
            cost = k('sim_cost_model')
            if self.sim_pp > 1 and self.sim_cost_model == "profile":
                raise ConfigError(f"{k.set('sim_pp', self.sim_pp)} is invalid with "
                                  f"{cost}='profile': a profile times the whole model's layers, "
                                  "not a stage's; "
                                  f"allowed: 1, or {cost}=calibrated or roofline")
            if self.sim_tp > 1 and self.sim_cost_model == "profile" and self.sim_device == "cpu":
                raise ConfigError(f"{k.set('sim_tp', self.sim_tp)} is invalid with "
                                  f"{cost}='profile' on {k('sim_device')}='cpu': "
                                  "a profile times one device; "
                                  f"allowed: 1, or {cost}=roofline")
        if self.world_size > 1 and self.overlap != "none":
            ranks = f"({k('tensor_parallel')} x {k('pipeline_parallel')})"
            raise ConfigError(f"{k.set('overlap', self.overlap)} is invalid with {self.world_size} "
                              f"ranks {ranks}: they run each batch whole; allowed: none")

    @property
    def kind(self) -> type[ExecutorKind]:
        return executor_class(self.executor)

    @property
    def world_size(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def kv_size_key(self) -> str | None:
        """Which setting sizes the KV cache: num_kv_blocks wins over kv_cache_gb; None: neither."""
        if self.num_kv_blocks is not None:
            return "num_kv_blocks"
        return "kv_cache_gb" if self.kv_cache_gb is not None else None

    def explicit_kv_blocks(self, block_bytes: int) -> int | None:
        """The blocks ``kv_size_key`` sizes, None if none; a size holding no block is refused."""
        if self.kv_size_key != "kv_cache_gb":
            return self.num_kv_blocks
        blocks = int(self.kv_cache_gb * 2**30 // block_bytes)
        if blocks < 1:
            raise ConfigError(f"{SETTING.set('kv_cache_gb', self.kv_cache_gb)} is invalid: "
                              f"it holds no block of {block_bytes} bytes")
        return blocks

    @property
    def device_type(self) -> str:
        if self.device == "auto":
            return "cuda" if cuda_available() else "cpu"
        return self.device

    @property
    def torch_device(self):
        import torch

        return torch.device(self.device_type)

    @property
    def torch_dtype(self):
        """bfloat16 on a CPU without bf16 matrix units runs as float32 (one warning): there its
        matmuls are far slower and would distort every cost ratio."""
        import torch

        runs = run_dtype(self.dtype, self.device_type)
        if runs != self.dtype:
            _warn_bf16_fallback()
        return getattr(torch, runs)


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100', as the simulator's devices and profiles/ are named."""
    chip = re.search(r"\b([AHBL]\d{2,3}|A6000)\b", name)
    return chip[1].lower() if chip else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def run_dtype(dtype: str, device_type: str) -> str:
    """A CPU without bf16 matrix units runs bfloat16 as float32."""
    bf16_on_cpu = dtype == "bfloat16" and device_type == "cpu"
    return "float32" if bf16_on_cpu and not cpu_has_bf16_units() else dtype


# Any other setting a caller hands over is a scheduler's knob.
ENGINE_FIELDS = frozenset(f.name for f in settings_of(EngineConfig))
# What every executor honours.
ENGINE_DEFAULTS = {f.name: f.default for f in settings_of(EngineConfig)}


@functools.cache
def _warn_bf16_fallback() -> None:
    # A log record, not warnings.warn: one line, once per process, without a source line.
    log.warning("dtype='bfloat16' runs as float32: this CPU has no bf16 matrix instructions")


def attention_backend(attention: str, device_type: str) -> str:
    """``auto`` is the Triton kernels on CUDA, PyTorch elsewhere."""
    if attention == "auto":
        return "triton" if device_type == "cuda" else "torch"
    return attention


def check_attention_hybrid(hybrid: str, backend: str) -> None:
    """Co-scheduled hybrid attention is a Triton kernel: refused beside any other backend."""
    if hybrid != "sequential" and backend != "triton":
        raise ConfigError(f"{SETTING.set('attention_hybrid', hybrid)} is invalid with the "
                          f"{backend} attention: it is a Triton kernel; allowed: sequential, or "
                          "with "
                          f"{SETTING('attention')}=triton")


def check_fields(obj: Any, positive: bool = False, zero_ok: tuple[str, ...] = (),
                 skip: tuple[str, ...] = (), keys: Callable[[str], str] = SETTING,
                 held: Collection[str] = ()) -> None:
    """Each field against its annotation (a bool is never an int); ``positive``: set numbers > 0
    (>= 0 in ``zero_ok``; ``skip``'s by the caller); ``held``: another config checks them."""


    hints = get_type_hints(type(obj))
    fields = [(f.name, as_python_number(getattr(obj, f.name))) for f in settings_of(type(obj))
              if not dataclasses.is_dataclass(hints[f.name]) and f.name not in held]
    for name, value in fields:
        _check_type(keys(name), value, hints[name])
        # numpy's number, stored as Python's (frozen dataclasses too)
        if value is not getattr(obj, name):
            object.__setattr__(obj, name, value)
    for name, value in fields if positive else ():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and name not in skip \
                and (value < 0 or value == 0 and name not in zero_ok):
            raise ConfigError(f"{keys(name)}={value!r} is invalid: "
                              f"must be {'>=' if name in zero_ok else '>'} 0")


def as_python_number(value: Any) -> Any:
    """numpy's integers, floats and bools as Python's, which every setting takes; else unchanged."""
    if isinstance(value, (bool, int, float)):
        return value
    # numpy 2's and 1's
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and type(value).__module__ == "numpy":
        return float(value)
    return value


def _check_type(key: str, value: Any, tp: Any) -> None:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return
        (inner,) = [a for a in args if a is not type(None)]
        _check_type(key, value, inner)
    elif origin is Literal:
        check_choice(key, value, args)
    elif origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={value!r} is invalid: must be a mapping")
    elif origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}={value!r} is invalid: must be a list")
        for i, item in enumerate(value):
            _check_type(f"{key}[{i}]", item, args[0])
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}={value!r} is invalid: must be of type float")
        if not math.isfinite(value):
            raise ConfigError(f"{key}={value!r} is invalid: must be a finite number")
    elif isinstance(value, bool) and tp is not bool or not isinstance(value, tp):
        raise ConfigError(f"{key}={value!r} is invalid: must be of type {tp.__name__}")


def check_choice(key: str, value: Any, allowed: tuple) -> None:
    """The one wording of every refused choice."""
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is invalid: "
                          f"allowed values are {', '.join(map(str, allowed))}")


def check_count(key: str, value: Any, least: int) -> None:
    """An integer (numpy's too; never a bool) of at least ``least``: tokens, requests, devices."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ConfigError(f"{key}={value!r} is invalid: must be an integer >= {least}")
