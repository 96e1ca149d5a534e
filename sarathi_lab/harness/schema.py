"""The typed shape of a run's config (conf/), and the check that turns a composed Hydra config into it.

Hydra's own struct mode already rejects unknown override keys; what it cannot know is types and
ranges, because the YAML tree is untyped. Every failure here is one line naming the key, the
value and what is allowed, raised as the engine's ConfigError so callers catch one type.
"""
from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from sarathi_lab.config import ConfigError
from sarathi_lab.harness.tasks import TASKS
from sarathi_lab.model.presets import PRESETS


def _positive(key: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{key}={value!r} is invalid: must be > 0")


@dataclass(frozen=True)
class ModelCfg:
    name: str
    path: str | None = None

    def __post_init__(self):
        allowed = (*PRESETS, "hf")
        if self.name not in allowed:
            raise ConfigError(f"model.name={self.name!r} is invalid: allowed values are {', '.join(allowed)}")
        if self.name == "hf" and not self.path:
            raise ConfigError("model.path=None is invalid: model=hf needs model.path=/a/local/hf/dir")

    @property
    def engine_model(self) -> str:
        """What LLM(model=...) takes: a preset name or a directory."""
        return self.path if self.name == "hf" else self.name


@dataclass(frozen=True)
class SchedulerCfg:
    name: str  # checked against the engine's registry by EngineConfig


@dataclass(frozen=True)
class DeviceCfg:
    name: str  # auto | cpu | cuda, checked (GPU presence included) by EngineConfig
    num_threads: int | None = None


@dataclass(frozen=True)
class WorkloadCfg:
    kind: Literal["synthetic", "uniform", "zipf", "trace"]
    num_requests: int = 4
    arrival: Literal["all_at_once", "poisson"] = "all_at_once"
    qps: float = 1.0
    # uniform / zipf: request lengths span [min_tokens, seq_len].
    min_tokens: int = 64
    theta: float = 0.6
    # synthetic: the first `stagger` requests get 0, 1, ..., stagger - 1 fewer decode tokens.
    stagger: int = 0
    # trace
    path: str | None = None
    time_scale: float = 1.0
    max_requests: int | None = None

    def __post_init__(self):
        for key in ("num_requests", "qps", "min_tokens", "theta"):
            _positive(f"workload.{key}", getattr(self, key))
        if self.max_requests is not None:
            _positive("workload.max_requests", self.max_requests)
        if self.time_scale < 0:
            raise ConfigError(f"workload.time_scale={self.time_scale!r} is invalid: must be >= 0")
        if self.stagger < 0:
            raise ConfigError(f"workload.stagger={self.stagger!r} is invalid: must be >= 0")
        if self.kind == "trace" and not self.path:
            raise ConfigError("workload.path=None is invalid: workload=trace needs a CSV path")


@dataclass(frozen=True)
class LoggerCfg:
    kind: Literal["wandb", "none"]
    project: str = "sarathi_lab"
    entity: str | None = None
    mode: Literal["auto", "offline", "online", "disabled"] = "auto"
    init_timeout_s: float = 30.0


@dataclass(frozen=True)
class EngineCfg:
    """LLM(...) arguments that no paper sweeps; EngineConfig checks their ranges."""
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_gb: float | None = None
    attention: str = "auto"
    cpu_linear: str = "onednn"
    max_model_len: int | None = None
    warmup_iters: int = 2


@dataclass(frozen=True)
class MeasureCfg:
    """Settings of the tasks other than serve (sarathi_lab.harness.tasks)."""
    reps: int = 3
    token_step: int = 8
    tile: int = 128

    def __post_init__(self):
        for key in ("reps", "token_step", "tile"):
            _positive(f"measure.{key}", getattr(self, key))


@dataclass(frozen=True)
class RunConfig:
    name: str
    chunk: int
    batch_size: int
    seq_len: int
    pd_ratio: float
    seed: int
    dtype: str
    model: ModelCfg
    scheduler: SchedulerCfg
    workload: WorkloadCfg
    device: DeviceCfg
    logger: LoggerCfg
    engine: EngineCfg = field(default_factory=EngineCfg)
    tags: list[str] = field(default_factory=list)
    on_existing: Literal["refuse", "skip", "overwrite"] = "refuse"
    task: str = "serve"
    measure: MeasureCfg = field(default_factory=MeasureCfg)

    def __post_init__(self):
        for key in ("chunk", "batch_size", "seq_len", "pd_ratio"):
            _positive(key, getattr(self, key))
        tasks = ("serve", *TASKS)
        if self.task not in tasks:
            raise ConfigError(f"task={self.task!r} is invalid: allowed values are {', '.join(tasks)}")

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of LLM(...) / EngineConfig(...)."""
        return dict(model=self.model.engine_model, scheduler=self.scheduler.name, chunk_size=self.chunk, token_budget=self.chunk,
                    max_batch_size=self.batch_size, device=self.device.name, dtype=self.dtype, seed=self.seed,
                    num_threads=self.device.num_threads, **dataclasses.asdict(self.engine))

    def key_values(self) -> dict[str, Any]:
        """The values a results table is indexed by (metrics.json "config", load_runs columns)."""
        return {"experiment": self.name, "task": self.task, "model": self.model.engine_model, "scheduler": self.scheduler.name,
                "chunk": self.chunk, "batch_size": self.batch_size, "seq_len": self.seq_len,
                "pd_ratio": self.pd_ratio, "seed": self.seed, "device": self.device.name, "dtype": self.dtype,
                "workload": self.workload.kind}


def parse_config(cfg: DictConfig) -> RunConfig:
    """The composed config as a RunConfig, or a one-line ConfigError."""
    try:
        raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as e:
        raise ConfigError(f"{e.full_key}=??? is invalid: a value is required") from None
    return _build(RunConfig, raw, prefix="")


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.')}={raw!r} is invalid: must be a mapping")
    hints = get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{prefix}{unknown[0]} is not a known key; known keys here: {', '.join(sorted(known))}")
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in raw
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{prefix}{missing[0]} is missing: a value is required")
    return cls(**{k: _typed(f"{prefix}{k}", v, hints[k]) for k, v in raw.items()})


def _typed(key: str, value: Any, tp: Any) -> Any:
    origin, args = get_origin(tp), get_args(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, prefix=f"{key}.")
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _typed(key, value, inner)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}={value!r} is invalid: allowed values are {', '.join(map(str, args))}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}={value!r} is invalid: must be a list")
        return [_typed(f"{key}[{i}]", v, args[0]) for i, v in enumerate(value)]
    # bool is an int subclass, and `chunk=true` is never what anyone meant.
    accepted = (int, float) if tp is float else (tp,)
    if isinstance(value, bool) or not isinstance(value, accepted):
        raise ConfigError(f"{key}={value!r} is invalid: must be of type {tp.__name__}")
    return tp(value)
