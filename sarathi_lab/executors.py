"""What runs a batch (``engine.executor``), registered with its capabilities as class attributes:
settings it cannot honour are refused before any work, and nothing outside this registry compares an
executor's name. Torch-free: the config checks against it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from sarathi_lab.refusal import AS_WRITTEN, ConfigError, Key, Words, Written

_REGISTRY: dict[str, type[ExecutorKind]] = {}


class ExecutorKind:
    """A flag: honours its settings at any value (else the default); a tuple: the values taken."""
    name: ClassVar[str]
    noun: ClassVar[str]
    runs_model: ClassVar[bool] = False  # timings exposed to this machine's load
    simulated: ClassVar[bool] = False
    # Else the harness builds another engine, named by ``engine_label``.
    our_engine: ClassVar[bool] = True
    engine_label: ClassVar[str | None] = None
    samples: ClassVar[bool] = True  # else placeholder tokens beside the times
    tensor_parallel: ClassVar[bool] = False
    pipeline_parallel: ClassVar[bool] = False
    cuda_graphs_mixed: ClassVar[bool] = True
    kv_watermark: ClassVar[bool] = True
    schedulers: ClassVar[tuple[str, ...] | None] = None
    attentions: ClassVar[tuple[str, ...] | None] = None
    attention_hybrids: ClassVar[tuple[str, ...] | None] = None
    overlaps: ClassVar[tuple[str, ...] | None] = None
    cpu_linears: ClassVar[tuple[str, ...] | None] = None


def register_executor(name: str):
    def wrap(cls: type[ExecutorKind]) -> type[ExecutorKind]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return wrap


def executor_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def executors_with(attribute: str) -> tuple[str, ...]:
    return tuple(n for n, cls in _REGISTRY.items() if getattr(cls, attribute))


def recorded_as(name: Any, attribute: str) -> bool:
    """An unknown name or a gap in a recorded run's records has no capability."""
    return isinstance(name, str) and name in _REGISTRY and bool(getattr(_REGISTRY[name], attribute))


def executor_class(name: str) -> type[ExecutorKind]:
    return _REGISTRY[name]


@register_executor("model")
class RealModel(ExecutorKind):
    noun = "the engine"
    runs_model = True
    tensor_parallel = pipeline_parallel = True


@register_executor("sim")
class Simulator(ExecutorKind):
    noun = "the simulator"
    simulated = True
    samples = False
    overlaps = ("none",)


@register_executor("vllm")
class Vllm(ExecutorKind):
    noun = "vLLM's engine"
    engine_label = "vLLM"
    our_engine = False
    cuda_graphs_mixed = kv_watermark = False
    # vLLM's scheduler with chunked prefill is sarathi_serve's batching; off, it is our vllm.
    schedulers = ("sarathi_serve", "vllm")
    attentions = cpu_linears = ("auto",)
    attention_hybrids = ("sequential",)
    overlaps = ("none",)


@dataclass(frozen=True)
class Capability:
    setting: str
    attribute: str
    lacks: str


CAPABILITIES = (
    Capability("tensor_parallel", "tensor_parallel", "splits no model across ranks"),
    Capability("pipeline_parallel", "pipeline_parallel", "splits no model into stages"),
    Capability("sim_tp", "simulated", "simulates no GPUs"),
    Capability("sim_pp", "simulated", "simulates no pipeline stages"),
    Capability("cuda_graphs_mixed", "cuda_graphs_mixed", "picks its own CUDA graphs"),
    Capability("kv_watermark", "kv_watermark", "admits by its own watermark"),
    Capability("scheduler", "schedulers", "has no such scheduler"),
    Capability("attention", "attentions", "picks its own attention kernels"),
    Capability("attention_hybrid", "attention_hybrids", "picks its own attention kernels"),
    Capability("overlap", "overlaps", "runs no nano-batches"),
    Capability("cpu_linear", "cpu_linears", "picks its own linear layers"),
)


def unhonoured(name: str, settings: dict[str, Any],
               defaults: dict[str, Any]) -> tuple[str, str, Words] | None:
    """(setting, why, allowed) of the first setting ``name`` cannot honour, with who would."""
    kind = executor_class(name)
    for cap in CAPABILITIES:
        value, default = settings[cap.setting], defaults[cap.setting]
        honours = getattr(kind, cap.attribute)
        if _takes(honours, value, default):
            continue
        allowed = ", ".join(map(str, honours)) if isinstance(honours, tuple) else str(default)
        others = [n for n, c in _REGISTRY.items()
                  if _takes(getattr(c, cap.attribute), value, default)]

        elsewhere = " (or " + Key("executor") + f"={', '.join(others)})" if others else ""
        return cap.setting, f"{kind.noun} {cap.lacks}", allowed + elsewhere
    return None


def _takes(honours: bool | tuple | None, value: Any, default: Any) -> bool:
    """A flag takes any value when set, the default when not; a tuple its values; None any."""
    if isinstance(honours, tuple):
        return value in honours
    return honours is not False or value == default


# What a task beyond serving needs: our engine's batches, or (profile) our forwards.
SERVING_TASKS = ("serve", "capacity")
TASK_NEEDS = {"profile": ("runs_model", "runs none of our model's forwards")}
BATCHES_OF_OURS = ("our_engine", "runs no batch of our engine")


def task_refusal(name: str, task: str) -> ConfigError | None:
    need, lacks = TASK_NEEDS.get(task, BATCHES_OF_OURS)
    if task in SERVING_TASKS or getattr(executor_class(name), need):
        return None
    can = ", ".join(executors_with(need))
    serving = "" if task in TASK_NEEDS else f", or task={', '.join(SERVING_TASKS)}"
    return ConfigError("task", Written(task),
                       f"is invalid with executor={name}: {executor_class(name).noun} {lacks}",
                       f"executor={can}" + serving, keys=AS_WRITTEN)

