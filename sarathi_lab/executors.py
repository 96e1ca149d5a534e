"""What runs a batch (``engine.executor``), registered as schedulers and attention backends are, each
with what it can honour as class attributes: every setting the chosen one cannot honour is refused
from these before any work, and nothing outside this registry compares an executor's name. Torch-free
and importing only the refusal's marks, so that the config at the bottom checks against it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from sarathi_lab.refusal import SETTING

_REGISTRY: dict[str, type[ExecutorKind]] = {}


class ExecutorKind:
    """An executor's capabilities: a flag whether it honours its settings at any value (without it,
    only their default); a tuple the values it takes (None: every one)."""
    name: ClassVar[str]
    # What the refusals call it.
    noun: ClassVar[str]
    # Our model's forward passes on this machine: its weights built, warm-up forwards, the CPU build's
    # library loaded, timings exposed to the host's load.
    runs_model: ClassVar[bool] = False
    # Times predicted by the simulator's cost model for sim_device on a virtual clock (sim_* read).
    simulated: ClassVar[bool] = False
    # Our scheduler, block manager and loop drive it, so LLM builds it; else another engine serves
    # the run's weights and the harness builds it, and ``engine_label`` names that engine.
    our_engine: ClassVar[bool] = True
    engine_label: ClassVar[str | None] = None
    # The model's tokens come out of it (sampling honoured); else placeholders beside the times.
    samples: ClassVar[bool] = True
    # The real model split across ranks, Megatron-style, and into pipeline stages (model/parallel/).
    tensor_parallel: ClassVar[bool] = False
    pipeline_parallel: ClassVar[bool] = False
    # Which forwards replay CUDA graphs is ours to choose (cuda_graphs_mixed).
    cuda_graphs_mixed: ClassVar[bool] = True
    # Admission leaves kv_watermark of the blocks free (our block manager's rule).
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
    """The executors whose flag ``attribute`` is set (``simulated``: those that predict)."""
    return tuple(n for n, cls in _REGISTRY.items() if getattr(cls, attribute))


def recorded_as(name: Any, attribute: str) -> bool:
    """Whether a recorded run's executor (the name its records hold: a run's config or environment,
    a column of them; an unknown name or a gap has no capability) had flag ``attribute``."""
    return isinstance(name, str) and name in _REGISTRY and bool(getattr(_REGISTRY[name], attribute))


def executor_class(name: str) -> type[ExecutorKind]:
    """The executor ``name`` picks (EngineConfig's Literal has refused any other name already)."""
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
    # Whose numbers a run's source names beside the device (results.run_source).
    engine_label = "vLLM"
    our_engine = False
    cuda_graphs_mixed = kv_watermark = False
    # vLLM's scheduler with chunked prefill on is sarathi_serve's stall-free batching; off, it is ours
    # named vllm (harness/vllm_args.py maps them).
    schedulers = ("sarathi_serve", "vllm")
    attentions = cpu_linears = ("auto",)
    attention_hybrids = ("sequential",)
    overlaps = ("none",)


@dataclass(frozen=True)
class Capability:
    """A setting an executor may not honour: ``setting`` (an EngineConfig field) is honoured by the
    class attribute ``attribute``; ``lacks``: what one without it does not do."""
    setting: str
    attribute: str
    lacks: str


# Every setting that an executor may drop, and what honours it: one table the refusals read.
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


def unhonoured(name: str, settings: dict[str, Any], defaults: dict[str, Any]) -> tuple[str, str, str] | None:
    """(setting, why, allowed) of the first of ``settings`` executor ``name`` cannot honour, or None;
    ``defaults``: the value of each that every executor honours; ``allowed`` ends with the executors
    that would honour the value set."""
    kind = executor_class(name)
    for cap in CAPABILITIES:
        value, default, honours = settings[cap.setting], defaults[cap.setting], getattr(kind, cap.attribute)
        if _takes(honours, value, default):
            continue
        allowed = ", ".join(map(str, honours)) if isinstance(honours, tuple) else str(default)
        others = [n for n, c in _REGISTRY.items() if _takes(getattr(c, cap.attribute), value, default)]
        elsewhere = f" (or {SETTING('executor')}={', '.join(others)})" if others else ""
        return cap.setting, f"{kind.noun} {cap.lacks}", allowed + elsewhere
    return None


def _takes(honours: bool | tuple | None, value: Any, default: Any) -> bool:
    """Whether a capability ``honours`` takes ``value``: a flag takes any value when set, the default
    (what a run does not ask for) when not; a tuple the values it lists; None every one."""
    if isinstance(honours, tuple):
        return value in honours
    return honours is not False or value == default


# What a run's task needs of its executor beyond serving arrivals (serve, capacity): the others drive
# our engine's batches one by one, and a profile times our model's own forwards.
SERVING_TASKS = ("serve", "capacity")
TASK_NEEDS = {"profile": ("runs_model", "runs none of our model's forwards")}
BATCHES_OF_OURS = ("our_engine", "runs no batch of our engine")


def task_refusal(name: str, task: str) -> str | None:
    """Why executor ``name`` cannot run ``task``, as one line naming what can, or None."""
    need, lacks = TASK_NEEDS.get(task, BATCHES_OF_OURS)
    if task in SERVING_TASKS or getattr(executor_class(name), need):
        return None
    can = ", ".join(executors_with(need))
    return (f"task={task} is invalid with executor={name}: {executor_class(name).noun} {lacks}; allowed: "
            f"executor={can}" + ("" if task in TASK_NEEDS else f", or task={', '.join(SERVING_TASKS)}"))
