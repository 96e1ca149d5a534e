"""The engine's configuration: one typed dataclass, a plain value checked without probing this host
(the plan does: plan.probe_host); a bad value fails with one line naming the setting, the value and
what is allowed, written once by the edge as the user set it (``Keys``)."""
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
from sarathi_lab.refusal import SETTING, ConfigError, as_written, named_as, render  # noqa: F401 (re-exported)

log = logging.getLogger("sarathi_lab")

# The package (its data ships with it: conf/, the simulator's devices and kernels) and the clone
# around it (docs/, profiles/, kernels/, outputs/): meaningful only when running from a clone.
PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent

# The choices the engine implements (schedulers are checked by their own registry when one is built).
ATTENTIONS = ("auto", "torch", "triton")
# How the Triton attention runs a batch of prefills beside decodes: one paged kernel over both, or
# prefill and decode work co-scheduled on each SM (sarathi_kernels/pod_attention.py).
ATTENTION_HYBRIDS = ("sequential", "pod")
# How a large hybrid batch's decode attention meets its GEMMs: after them, or overlapped with them as
# two nano-batches on two streams (model/nano_batch.py).
OVERLAPS = ("none", "nano_batch")
# Bytes per element of each dtype the engine runs, for torch-free sizing.
DTYPE_BYTES = {"bfloat16": 2, "float32": 4, "float16": 2}
DTYPES = tuple(DTYPE_BYTES)
CPU_LINEARS = ("auto", "mkl", "onednn", "aten")
SIM_COST_MODELS = ("roofline", "profile", "calibrated")
EXECUTORS = executor_names()
# numpy's and torch's generators both take seeds in [0, 2**64).
MAX_SEED = 2**64 - 1
# The share of the KV cache's blocks a request must leave free to be admitted: vLLM's and
# sarathi-serve's default watermark.
KV_WATERMARK = 0.01
# The most a watermark may keep free: past half, most of the cache idles while requests wait, and the
# default cache, sized with the watermark on top, grows without bound as it nears 1.
MAX_KV_WATERMARK = 0.5
# The share of a GPU's memory the weights and KV cache may take (vLLM's gpu_memory_utilization default).
GPU_MEMORY_UTILISATION = 0.9


@dataclass(frozen=True)
class Keys:
    """The edge's map from settings to the keys the user sets them by: a setting is ``prefix`` + its
    name (LLM's keyword arguments: no prefix; a run's config: engine.block_size), a scheduler's knob
    ``knob_prefix`` + its name (scheduler.tile), but those in ``names`` (a run's knobs: chunk_size is
    `chunk`). ``shown``: a value as the user set it where the engine refuses another it was turned
    into (token_budget=auto, tuned to a count)."""
    names: Mapping[str, str] = field(default_factory=dict)
    prefix: str = ""
    knob_prefix: str = ""
    shown: Mapping[str, str] = field(default_factory=dict)

    def __call__(self, setting: str) -> str:
        if setting in self.names:
            return self.names[setting]
        return (self.prefix if setting in ENGINE_FIELDS else self.knob_prefix) + setting

    def set(self, setting: str, value: Any) -> str:
        """``key=value`` of ``setting`` at ``value``, as a refusal of it begins."""
        return self._at(setting, repr(value))

    def _at(self, setting: str, shown: str) -> str:
        return f"{self(setting)}={self.shown.get(setting, shown)}"

    def render(self, text: str) -> str:
        """A core refusal's line with each marked setting named as the user set it."""
        return render(text, self, self._at)


# Each setting by its own name: LLM's keyword arguments, and any caller that names no other keys.
AS_WRITTEN = Keys()


def settings_of(cls: type) -> list[dataclasses.Field]:
    """A config dataclass's settings: its fields."""
    return list(dataclasses.fields(cls))


@dataclass
class EngineConfig:
    model: str = "tiny"
    scheduler: str = "sarathi"
    # The tokens a chunking scheduler takes per iteration, the one home of the run's `chunk`: `sarathi`'s
    # prefill chunk (one per iteration), `sarathi_serve`'s token budget (decodes included).
    chunk_size: int = 512
    max_batch_size: int = 8
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal[DTYPES] = "bfloat16"
    seed: int = 0
    block_size: int = 16
    # KV capacity: an explicit block count wins over a memory budget; with neither, on a GPU vLLM's
    # rule: GPU_MEMORY_UTILISATION of its memory (a real one's free memory, a simulated one's all of it)
    # less the weights and the activations of the scheduler's largest iteration (a whole-prompt
    # scheduler's can hold every token the cache does: both are sized together); on a CPU enough for
    # max_batch_size requests of max_model_len tokens (the paper's preallocation; as many for each of the
    # pipeline_parallel micro-batches in flight), capped by a share of memory and by what the weights
    # leave. model/memory.py decides it for the engine and the simulator.
    num_kv_blocks: int | None = None
    kv_cache_gb: float | None = None
    # Admission leaves int(kv_watermark * blocks) free for running requests to grow into before one is
    # preempted; the default cache is sized with it on top.
    kv_watermark: float = KV_WATERMARK
    attention: Literal[ATTENTIONS] = "auto"
    # "pod": the Triton attention's hybrid batches in one persistent launch whose programs share each SM
    # between prefill tiles and decodes (eager, and replayed from CUDA graphs of that launch);
    # "sequential" until a GPU measures the gain.
    attention_hybrid: Literal[ATTENTION_HYBRIDS] = "sequential"
    # "nano_batch": hybrid batches of model/nano_batch.py's MIN_OVERLAP_TOKENS or more run as two
    # nano-batches, one's attention on a side stream beside the other's GEMMs (eager: the engine's
    # CUDA graphs hold sequential forwards); "none" until a GPU measures the gain.
    overlap: Literal[OVERLAPS] = "none"
    # On CUDA with the Triton attention, forwards replay CUDA graphs captured when the engine is built
    # (model/cuda_graphs.py): decode-only ones, and with cuda_graphs_mixed those with prefills (chunks
    # alone or beside decodes, whole prompts) up to a token count; false: every forward eager. Nothing
    # to capture elsewhere.
    cuda_graphs: bool = True
    cuda_graphs_mixed: bool = True
    max_model_len: int | None = None
    # The scheduler's own knobs ({knob: value}; vllm's max_num_batched_tokens), from its YAML or LLM's
    # other keyword arguments, checked against its Config when it is built.
    scheduler_knobs: dict[str, Any] = field(default_factory=dict)
    # Forward passes run before a generate call's clock starts (kernel warm-up, allocator growth).
    warmup_iters: int = 2
    num_threads: int | None = None
    # CPU linear layers over packed weights: "auto" picks by CPU and rows, "mkl" and "onednn" force
    # that GEMM, "aten" keeps F.linear (docs/cpu_engine.md).
    cpu_linear: Literal[CPU_LINEARS] = "auto"
    # "model": the real forward pass on `device`; "sim": a cost model's time on `sim_device`, a virtual clock;
    # "vllm": vLLM's own engine serving the same weights (harness/vllm_engine.py). What each honours:
    # sarathi_lab/executors.py.
    executor: Literal[EXECUTORS] = "model"
    sim_device: str = "h100"
    sim_cost_model: Literal[SIM_COST_MODELS] = "roofline"
    # True lets an explicit KV cache larger than sim_device's memory run, for what-if batches the
    # device could not hold (the papers' sweeps past an A6000's memory).
    sim_kv_beyond_device: bool = False
    # Tensor-parallel GPUs of sim_device serving as one, Megatron-style (sim/parallel.py).
    sim_tp: int = 1
    # Pipeline stages of sim_tp GPUs each, the layers split as the engine splits them, several
    # micro-batches in flight as the real engine's pipeline keeps them (sim/pipeline_executor.py).
    sim_pp: int = 1
    # Ranks the real model's layers are split across, Megatron-style, one process each: projections
    # and KV heads sharded, an all-reduce after o_proj and down_proj (model/parallel/). The ranks are
    # spawned by the engine, or started by torchrun (its RANK and WORLD_SIZE).
    tensor_parallel: int = 1
    # Pipeline stages the layers are split across (each stage tensor_parallel ranks): activations go
    # stage to stage; one micro-batch in flight at a time.
    pipeline_parallel: int = 1
    # The longest any collective of a parallel step waits for a peer: a rank that died or hangs ends
    # the run with an error naming it, never a hang.
    collective_timeout_s: float = 120.0

    def __post_init__(self):
        k = SETTING
        check_fields(self, positive=True, zero_ok=("warmup_iters",), skip=("seed", "kv_watermark"), keys=k)
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"{k.set('seed', self.seed)} is invalid: must be in [0, 2**64 - 1]")
        if not 0 <= self.kv_watermark <= MAX_KV_WATERMARK:
            raise ConfigError(f"{k.set('kv_watermark', self.kv_watermark)} is invalid: must be in [0, "
                              f"{MAX_KV_WATERMARK}] (the share of the KV cache admission leaves free; vLLM's is "
                              f"{KV_WATERMARK})")
        if bad := unhonoured(self.executor, vars(self), ENGINE_DEFAULTS):
            setting, why, allowed = bad
            raise ConfigError(f"{k.set(setting, getattr(self, setting))} is invalid with "
                              f"{k.set('executor', self.executor)}: {why}; allowed: {allowed}")
        if self.kind.simulated:
            if self.sim_pp > 1 and self.sim_cost_model == "profile":
                raise ConfigError(f"{k.set('sim_pp', self.sim_pp)} is invalid with {k('sim_cost_model')}='profile': "
                                  f"a profile times the whole model's layers, not a stage's; allowed: 1, or "
                                  f"{k('sim_cost_model')}=calibrated or roofline")
            if self.sim_tp > 1 and self.sim_cost_model == "profile" and self.sim_device == "cpu":
                raise ConfigError(f"{k.set('sim_tp', self.sim_tp)} is invalid with {k('sim_cost_model')}='profile' on "
                                  f"{k('sim_device')}='cpu': a profile times one device; allowed: 1, or "
                                  f"{k('sim_cost_model')}=roofline")
        if self.world_size > 1 and self.overlap != "none":
            ranks = f"({k('tensor_parallel')} x {k('pipeline_parallel')})"
            raise ConfigError(f"{k.set('overlap', self.overlap)} is invalid with {self.world_size} "
                              f"ranks {ranks}: they run each batch whole; allowed: none")

    @property
    def kind(self) -> type[ExecutorKind]:
        """What its executor honours (sarathi_lab/executors.py)."""
        return executor_class(self.executor)

    @property
    def world_size(self) -> int:
        """The ranks of the real engine: tensor_parallel in each of pipeline_parallel stages."""
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def kv_size_key(self) -> str | None:
        """The setting that sizes the KV cache: num_kv_blocks wins over kv_cache_gb; None: neither."""
        if self.num_kv_blocks is not None:
            return "num_kv_blocks"
        return "kv_cache_gb" if self.kv_cache_gb is not None else None

    def explicit_kv_blocks(self, block_bytes: int) -> int | None:
        """The blocks of a KV cache sized by ``kv_size_key``, None if none is; refuses a size holding no block."""
        if self.kv_size_key != "kv_cache_gb":
            return self.num_kv_blocks
        blocks = int(self.kv_cache_gb * 2**30 // block_bytes)
        if blocks < 1:
            raise ConfigError(f"{SETTING.set('kv_cache_gb', self.kv_cache_gb)} is invalid: it holds no block of "
                              f"{block_bytes} bytes")
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
        """The dtype the engine runs in: bfloat16 on a CPU without bf16 matrix units runs as float32
        (with one warning), since there its matmuls are far slower and would distort every cost ratio."""
        import torch

        runs = run_dtype(self.dtype, self.device_type)
        if runs != self.dtype:
            _warn_bf16_fallback()
        return getattr(torch, runs)


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100': a GPU's reported name as the simulator's device names go
    (and the folders of profiles/ and docs/gpu/); a chip it cannot find is the whole name, slugged."""
    chip = re.search(r"\b([AHBL]\d{2,3}|A6000)\b", name)
    return chip[1].lower() if chip else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def run_dtype(dtype: str, device_type: str) -> str:
    """The dtype a device of ``device_type`` (real or simulated) runs when asked for ``dtype``: a CPU
    without bf16 matrix units runs bfloat16 as float32."""
    return "float32" if dtype == "bfloat16" and device_type == "cpu" and not cpu_has_bf16_units() else dtype


# Its settings: any other a caller hands over is a scheduler's knob (LLM, the Hydra schema, the schedulers).
ENGINE_FIELDS = frozenset(f.name for f in settings_of(EngineConfig))
# What each setting is when none is given: what every executor honours.
ENGINE_DEFAULTS = {f.name: f.default for f in settings_of(EngineConfig)}


@functools.cache
def _warn_bf16_fallback() -> None:
    # A log record, not warnings.warn: one line, once per process, without a source line.
    log.warning("dtype='bfloat16' runs as float32: this CPU has no bf16 matrix instructions")


def attention_backend(attention: str, device_type: str) -> str:
    """The backend ``attention`` names on a device: ``auto`` is the Triton kernels on CUDA, PyTorch elsewhere."""
    if attention == "auto":
        return "triton" if device_type == "cuda" else "torch"
    return attention


def check_attention_hybrid(hybrid: str, backend: str) -> None:
    """Co-scheduled hybrid attention is a Triton kernel: refused beside any other backend."""
    if hybrid != "sequential" and backend != "triton":
        raise ConfigError(f"{SETTING.set('attention_hybrid', hybrid)} is invalid with the {backend} attention: it "
                          f"is a Triton kernel; allowed: sequential, or with {SETTING('attention')}=triton")


def check_fields(obj: Any, positive: bool = False, zero_ok: tuple[str, ...] = (),
                 skip: tuple[str, ...] = (), keys: Callable[[str], str] = SETTING,
                 held: Collection[str] = ()) -> None:
    """Each field of a config dataclass against its annotation (int, finite float, str, bool, X | None,
    Literal, list[X], dict); a bool is never an int here. ``positive``: then each number that is set
    must be > 0, >= 0 those in ``zero_ok``; those in ``skip`` have other bounds, checked by the caller.
    ``keys``: the key each field is set by, as a refusal names it (default: its field, marked).
    ``held``: fields another config holds and checks (a run's chunk: EngineConfig's chunk_size)."""
    hints = get_type_hints(type(obj))
    fields = [(f.name, as_python_number(getattr(obj, f.name))) for f in settings_of(type(obj))
              if not dataclasses.is_dataclass(hints[f.name]) and f.name not in held]
    for name, value in fields:
        _check_type(keys(name), value, hints[name])
        if value is not getattr(obj, name):  # numpy's number, stored as Python's (frozen dataclasses too)
            object.__setattr__(obj, name, value)
    for name, value in fields if positive else ():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and name not in skip \
                and (value < 0 or value == 0 and name not in zero_ok):
            raise ConfigError(f"{keys(name)}={value!r} is invalid: must be {'>=' if name in zero_ok else '>'} 0")


def as_python_number(value: Any) -> Any:
    """numpy's integers, floats and bools (np.int64(8), a value read from an array) as Python's, which
    every setting takes (a bool still no number); anything else as it is."""
    if isinstance(value, (bool, int, float)):
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):  # numpy 2 and 1
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
    """``value`` is one of ``allowed``: the one wording of every refused choice."""
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is invalid: allowed values are {', '.join(map(str, allowed))}")


def check_count(key: str, value: Any, least: int) -> None:
    """An integer (numpy's too; never a bool) of at least ``least``: a count of tokens, requests or devices."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ConfigError(f"{key}={value!r} is invalid: must be an integer >= {least}")
