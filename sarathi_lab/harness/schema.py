"""A run's config (conf/), typed; each value checked once, by the dataclass holding it."""
from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal, get_type_hints

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from sarathi_lab.config import (
    ENGINE_FIELDS,
    ConfigError,
    EngineConfig,
    Keys,
    check_choice,
    check_fields,
    named_as,
    settings_of,
)
from sarathi_lab.engine.metrics import SLO
from sarathi_lab.engine.scheduler import (
    SchedulerConfig,
    knob_names,
    scheduler_class,
    scheduler_names,
)
from sarathi_lab.engine.scheduler.base import unknown_knob
from sarathi_lab.engine.tiles import GEMM_TILE
from sarathi_lab.executors import task_refusal
from sarathi_lab.harness.tasks import task_names
from sarathi_lab.model.presets import PRESETS


class _Section:
    """A section (``workload:``): numbers > 0 (>= 0 in ``zero_ok``), keys named ``workload.KEY``."""
    keys: ClassVar[Keys]
    zero_ok: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, section: str, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.keys = Keys(prefix=f"{section}.", knob_prefix=f"{section}.")

    def __post_init__(self):
        check_fields(self, positive=True, zero_ok=self.zero_ok, keys=self.keys)


@dataclass(frozen=True)
class ModelCfg(_Section, section="model"):
    name: Literal[(*PRESETS, "hf")]
    path: str | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.name == "hf" and not self.path:
            raise ConfigError(f"{self.keys.set('path', None)} is invalid: "
                              "model=hf needs model.path=/a/local/hf/dir")
        # A preset's path would be silently ignored.
        if self.name != "hf" and self.path is not None:
            raise ConfigError(f"{self.keys.set('path', self.path)} is invalid with "
                              f"model={self.name}: a preset reads no directory; allowed: null, "
                              "or model=hf to load that directory")

    @property
    def engine_model(self) -> str:
        return self.path if self.name == "hf" else self.name


@dataclass(frozen=True)
class SchedulerCfg:
    """conf/scheduler/NAME.yaml; the engine checks it when the preflight builds it."""
    name: str
    knobs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, raw: Any) -> SchedulerCfg:
        if not isinstance(raw, dict) or "name" not in raw:
            raise ConfigError(f"scheduler={raw!r} is invalid: must be a mapping with a name")
        knobs = {key: value for key, value in raw.items() if key != "name"}
        for key, value in knobs.items():
            if _set_by("scheduler", key):
                raise unknown_key(f"scheduler.{key}", repr(value))
        return cls(raw["name"], knobs)


@dataclass(frozen=True)
class DeviceCfg:
    name: str  # checked by EngineConfig
    num_threads: int | None = None


@dataclass(frozen=True)
class WorkloadCfg(_Section, section="workload"):
    # trace_lengths: a trace's lengths, `arrival` at `qps`.
    kind: Literal["synthetic", "uniform", "zipf", "trace", "trace_lengths"]
    num_requests: int | None = 4  # trace: None replays every row
    arrival: Literal["all_at_once", "poisson", "gamma"] = "all_at_once"
    qps: float | None = 1.0  # trace: None replays as recorded, times time_scale
    cv: float = 1.0
    max_concurrency: int | None = None
    min_tokens: int = 64
    theta: float = 0.6
    # synthetic: the first `stagger` requests get 0, 1, ... fewer decode tokens.
    stagger: int = 0
    path: str | None = None
    time_scale: float = 1.0
    length_scale: float = 1.0
    max_requests: int | None = None  # trace_lengths: draw from the first N rows only
    offset: int = 0
    zero_ok: ClassVar[tuple[str, ...]] = ("time_scale", "stagger", "offset")

    def __post_init__(self):
        super().__post_init__()
        k = self.keys
        trace = self.kind in ("trace", "trace_lengths")
        if trace and not self.path:
            raise ConfigError(f"{k.set('path', None)} is invalid: "
                              f"workload={self.kind} needs a CSV path")
        for key in ("num_requests", "qps"):
            if getattr(self, key) is None and self.kind != "trace":
                raise ConfigError(f"{k.set(key, None)} is invalid with workload={self.kind}: "
                                  "null (every row, the recorded rate) is for a trace's replay "
                                  "(workload=trace) only")
        if self.kind == "trace" and self.max_requests is not None:
            raise ConfigError(f"{k.set('max_requests', self.max_requests)} is invalid with "
                              "workload=trace: the first N rows it replays are "
                              "workload.num_requests")
        if self.kind == "trace" and self.qps is not None and self.time_scale != 1:
            raise ConfigError(f"{k.set('time_scale', self.time_scale)} is invalid with "
                              f"workload.qps={self.qps!r}: both set the replayed trace's rate; "
                              "workload.qps=null scales the recorded times by time_scale")
        if self.offset and not trace:
            raise ConfigError(f"{k.set('offset', self.offset)} is invalid with "
                              f"workload={self.kind}: it skips a trace's rows")


@dataclass(frozen=True)
class LoggerCfg(_Section, section="logger"):
    kind: Literal["wandb", "none"]
    project: str = "sarathi_lab"
    entity: str | None = None
    mode: Literal["auto", "offline", "online", "disabled"] = "auto"
    init_timeout_s: float = 30.0


@dataclass(frozen=True)
class MeasureCfg(_Section, section="measure"):
    reps: int = 3
    token_step: int = 8
    tile: int = GEMM_TILE  # m + 1 is timed too for each multiple m of this
    # task=profile's largest iteration (None: chunk + batch_size).
    max_tokens: int | None = None
    pin_stages: bool = False
    # Requests whose timeline prices the stages' handoff (None: an idle ping-pong prices it).
    handoff_requests: int | None = None


@dataclass(frozen=True)
class SLOCfg(_Section, section="slo"):
    tbt_p99_s: float | None = None
    sched_delay_p50_s: float | None = 2.0
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def as_slo(self) -> SLO:
        return SLO(**dataclasses.asdict(self))


@dataclass(frozen=True)
class CapacityCfg(_Section, section="capacity"):
    start_qps: float = 1.0
    resolution: float = 0.05  # relative
    max_trials: int = 12
    require_stable: bool = True  # a queue that grew through the arrivals fails too
    min_qps: float = 1e-3
    max_qps: float = 1e4
    # A fixed window lets a queue near capacity show whether it drains (None: all).
    trial_s: float | None = None
    min_requests: int = 12

    def __post_init__(self):
        super().__post_init__()
        if not self.min_qps <= self.start_qps <= self.max_qps:
            raise ConfigError(f"{self.keys.set('start_qps', self.start_qps)} is invalid: must be "
                              f"within [min_qps={self.min_qps}, max_qps={self.max_qps}]")


@dataclass(frozen=True)
class ExportCfg(_Section, section="export"):
    """Written beside the results; none of it changes what the run measures."""
    timeline: bool = False


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
    engine: EngineConfig
    scale: Literal["full", "ci"] = "full"
    tags: list[str] = field(default_factory=list)
    on_existing: Literal["refuse", "skip", "overwrite"] = "refuse"
    task: str = "serve"  # or a measurement of harness/tasks.py's table
    measure: MeasureCfg = field(default_factory=MeasureCfg)
    slo: SLOCfg = field(default_factory=SLOCfg)
    capacity: CapacityCfg = field(default_factory=CapacityCfg)
    export: ExportCfg = field(default_factory=ExportCfg)
    # None follows `chunk`; "auto": set from slo.tbt_p99_s.
    token_budget: Literal["auto"] | None = None
    # How the engine's refusals name its settings in this run: decided here, read by every edge.
    keys: Keys = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "keys", engine_keys(self.model))
        # EngineConfig (built first) checks chunk, batch_size, seed, dtype.
        check_fields(self, positive=True, held=frozenset(KNOB_KEYS.values()))
        check_choice("task", self.task, ("serve", *task_names()))
        # Only sarathi_serve's is checked, so that one sweep over schedulers can set auto.
        slo, wl = self.slo, self.workload
        serve = self.scheduler.name == "sarathi_serve"
        if self.token_budget == "auto" and serve and slo.tbt_p99_s is None:
            raise ConfigError("token_budget=auto is invalid with slo.tbt_p99_s=None: "
                              "the budget comes from that SLO")
        replay = wl.kind == "trace"
        fixed_rate = ("workload.time_scale=0" if replay and wl.time_scale == 0 else
                      "workload.arrival=all_at_once" if not replay and wl.arrival == "all_at_once"
                      else None)
        if self.task == "capacity" and fixed_rate:
            raise ConfigError(f"{fixed_rate} is invalid with task=capacity: the search sets "
                              "the rate, so it needs arrival=poisson or gamma, or a trace replayed "
                              "at a rate (workload=trace with time_scale > 0: its gaps scaled to "
                              "each rate tried)")

        if self.task == "capacity" and slo.tbt_p99_s is None and slo.sched_delay_p50_s is None:
            raise ConfigError("slo.tbt_p99_s=None is invalid with task=capacity and "
                              "slo.sched_delay_p50_s=None: the search needs at least one of them")
        if why := task_refusal(self.engine.executor, self.task):
            raise ConfigError(why)
        if self.task == "piggyback" and self.batch_size < 2:
            raise ConfigError(f"batch_size={self.batch_size} is invalid with task=piggyback: B - 1 "
                              "decodes must ride the chunk, so it must be >= 2")
        if self.task == "iteration_sweep" and self.measure.token_step > self.seq_len:
            raise ConfigError(f"measure.token_step={self.measure.token_step} is invalid with "
                              f"task=iteration_sweep: must be <= seq_len={self.seq_len}, "
                              "the most tokens it times")

    def ignores(self, key: str) -> str | None:
        """Why this run reads nothing of ``key``."""
        if self.task not in ("serve", "capacity"):
            return None
        name, scheduler = self.scheduler.name, scheduler_class(self.scheduler.name)
        if key == "token_budget":
            sets, reads = {key}, {f.name for f in dataclasses.fields(scheduler.Config)}
        else:
            sets = ({key.removeprefix("scheduler.")} if key.startswith("scheduler.")
                    else {f for f, by in KNOB_KEYS.items() if by == key})
            reads = scheduler.Config.reads()
        if not sets or not sets <= _scheduler_only_fields():
            return None
        if key == "chunk" and name == "sarathi_serve" and self.token_budget == "auto":
            return ("scheduler=sarathi_serve with token_budget=auto takes its budget from "
                    "slo.tbt_p99_s")
        if sets & reads:
            return None
        if key.startswith("scheduler."):
            return f"scheduler={name} has no knob {key.removeprefix('scheduler.')}"
        whole = " (it prefills prompts whole)" if scheduler.prefills_whole_prompts else ""
        return f"scheduler={name} does not read {key}" + whole

    def key_values(self) -> dict[str, Any]:
        """A results table's index; a served trace's lengths stand in for seq_len and pd_ratio."""
        trace = (self.task in ("serve", "capacity")
                 and self.workload.kind in ("trace", "trace_lengths"))
        return {"experiment": self.name, "task": self.task, "scale": self.scale,
                "model": self.model.engine_model, "scheduler": self.scheduler.name,
                "chunk": self.chunk, "batch_size": self.batch_size,
                "seq_len": None if trace else self.seq_len,
                "pd_ratio": None if trace else self.pd_ratio,
                "seed": self.seed, "device": self.device.name, "dtype": self.dtype,
                "executor": self.engine.executor, "workload": self.workload.kind}


def _scheduler_only_fields() -> set[str]:
    configs = [scheduler_class(n).Config for n in scheduler_names()]
    every = {f.name for c in configs for f in dataclasses.fields(c)}
    every = every.union(*(c.reads() for c in configs))
    return every - SchedulerConfig.reads()


# {field: (its key, its value)}; `chunk` sets both sarathi's chunk and sarathi_serve's budget.
_KNOBS: dict[str, tuple[str, Callable[[dict[str, Any]], Any]]] = {
    "model": ("model", lambda run: run["model"].engine_model),
    "scheduler": ("scheduler", lambda run: run["scheduler"].name),
    "chunk_size": ("chunk", lambda run: run["chunk"]),
    "max_batch_size": ("batch_size", lambda run: run["batch_size"]),
    "device": ("device", lambda run: run["device"].name),
    "num_threads": ("device.num_threads", lambda run: run["device"].num_threads),
    "dtype": ("dtype", lambda run: run["dtype"]),
    "seed": ("seed", lambda run: run["seed"]),
    "scheduler_knobs": ("scheduler", lambda run: run["scheduler"].knobs),
}
KNOB_KEYS = {name: key for name, (key, _) in _KNOBS.items()}
RUN_KEYS = Keys(KNOB_KEYS, prefix="engine.", knob_prefix="scheduler.")


def engine_keys(model: ModelCfg) -> Keys:
    if model.name != "hf":
        return RUN_KEYS
    return replace(RUN_KEYS, names={**KNOB_KEYS, "model": "model.path"})


def parse_config(cfg: DictConfig) -> RunConfig:
    try:
        raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as e:
        raise ConfigError(f"{e.full_key}=??? is invalid: a value is required") from None
    run = _fields(RunConfig, raw, prefix="", later={"engine", "scheduler"})
    run["scheduler"] = SchedulerCfg.of(raw.get("scheduler"))
    run["engine"] = _engine_config(run, raw.get("engine", {}))
    return RunConfig(**run)


def _engine_config(run: dict[str, Any], raw: Any) -> EngineConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"engine={raw!r} is invalid: must be a mapping")
    for key, value in raw.items():
        if _set_by("engine", key):
            raise unknown_key(f"engine.{key}", repr(value))
    fields = _fields(EngineConfig, raw, prefix="engine.", later=set(KNOB_KEYS))
    with named_as(engine_keys(run["model"])):
        return EngineConfig(**fields, **{name: value(run) for name, (_, value) in _KNOBS.items()})


def _fields(cls: type, raw: Any, prefix: str, later: set[str] = frozenset()) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.')}={raw!r} is invalid: must be a mapping")
    hints = get_type_hints(cls)
    known = {f.name for f in settings_of(cls)} - later
    if unknown := sorted(set(raw) - known - later):
        key = unknown[0]
        raise unknown_key(f"{prefix}{key}", repr(raw[key]), {f"{prefix}{k}" for k in known})
    missing = [f.name for f in settings_of(cls) if f.name not in raw and f.name not in later
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{prefix}{missing[0]} is missing: a value is required")
    return {k: _typed(f"{prefix}{k}", v, hints[k]) for k, v in raw.items() if k not in later}


def unknown_key(key: str, shown: str, known: Collection[str] = ()) -> ConfigError:
    """The one refusal of an unknown key: the key that sets what it would, else the nearest."""
    section, _, name = key.rpartition(".")
    if by := _set_by(section, name):
        return ConfigError(f"{key}={shown} is invalid: the run's config sets it by {by}; "
                           f"allowed: {by}={shown}")
    if section == "scheduler" and name not in knob_names():
        return unknown_knob(name, shown).named(RUN_KEYS)
    nearest = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.6)
    beside = [k for k in sorted(known) if k.rpartition(".")[0] == section] or \
        [k for k in sorted(known) if "." not in k]
    hint = f"nearest known keys: {', '.join(nearest)}" if nearest else \
        f"known keys here: {', '.join(beside)}"
    return ConfigError(f"{key}={shown} is invalid: {key} is not a known key; {hint}")


def _set_by(section: str, name: str) -> str | None:
    """engine.chunk_size: chunk."""
    engine = section == "engine" and (name in KNOB_KEYS or name in knob_names())
    return RUN_KEYS(name) if engine or section == "scheduler" and name in ENGINE_FIELDS else None


def _typed(key: str, value: Any, tp: Any) -> Any:
    if dataclasses.is_dataclass(tp):
        return tp(**_fields(tp, value, prefix=f"{key}."))
    # YAML writes 48 for 48.0; the dataclass checks everything else.
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value
