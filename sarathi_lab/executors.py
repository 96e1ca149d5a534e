"""What runs a batch (``engine.executor``), registered with its capabilities as class attributes:
settings it cannot honour are refused before any work, and nothing outside this registry compares an
executor's name. Each kind also names how it is planned, built, warmed up and recorded, and callers
ask it (``build(plan)``, ``kind.plan(...)``, ``kind.warm_up(llm)``, ``kind.record(...)``) rather than
branch on what it is.
Torch-free: the config checks against it."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, ClassVar

from sarathi_lab.refusal import AS_WRITTEN, ConfigError, Key, Words, Written

_REGISTRY: dict[str, type[ExecutorKind]] = {}


class ExecutorKind:
    """A flag: honours its settings at any value (else the default); a tuple: the values taken."""
    name: ClassVar[str]
    noun: ClassVar[str]
    # What it needs: our model's forwards (timings exposed to this machine's load).
    runs_model: ClassVar[bool] = False
    # What it records: predicted times (a simulated device), else measured ones; another engine's
    # numbers are labelled ``engine_label``.
    simulated: ClassVar[bool] = False
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
    # The setting that counts its pipeline stages.
    stages_setting: ClassVar[str] = "pipeline_parallel"
    tags: ClassVar[tuple[str, ...]] = ()  # its runs' W&B tags
    # What its records say of the machine's load, beside what the run measured of it.
    load_record: ClassVar[dict[str, Any]] = {}
    # Its gc generation-0 threshold; None: Python's default (collections' pauses land in the times).
    gc_gen0_threshold: ClassVar[int | None] = None
    # How it is planned, built and recorded: "module:callable", imported when called, since what
    # they name sits in the layers above this registry (the plan, the engine, the harness).
    planner: ClassVar[str] = "sarathi_lab.plan:plan_on_device"          # (cfg, limits) -> plan
    plan_check: ClassVar[str | None] = None                             # (plan) -> None or refuses
    engine: ClassVar[str] = "sarathi_lab.llm:LLM.from_plan"             # (plan, shared) -> engine
    # (llm, scheduler) -> (executor, clock): our engine's batches; None: another engine serves
    # the plan (the harness builds it, ``engine``).
    batches: ClassVar[str | None] = "sarathi_lab.llm:model_batches"
    recorder: ClassVar[str] = "sarathi_lab.harness.environment:measured_record"  # (engine, device)
    budgeter: ClassVar[str] = "sarathi_lab.harness.budget:measured_budget"      # (engine) -> source
    # Steps only some kinds take (our model's), named the same way; None: the kind takes none.
    preparer: ClassVar[str | None] = None      # (plan) -> None: loads, before its run is marked running
    sharer: ClassVar[str | None] = None        # (run config) -> the process's engine parts it takes over
    warmer: ClassVar[str | None] = None        # (llm) -> the throwaway request it ran before the records
    parts_built: ClassVar[str | None] = None   # (llm) -> {part: built, reused...} of its set-up
    timing_check: ClassVar[str | None] = None  # (llm) -> why its times are unreliable whatever the load
    # The devices whose runs of it the simulator's own devices were measured from: where a sweep's
    # estimate of its seconds ahead may ask the simulator.
    simulator_times_on: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def stages(cls, engine: Any) -> int:
        return getattr(engine, cls.stages_setting)

    @classmethod
    def plan(cls, cfg: Any, limits: Any = None) -> Any:
        return _target(cls.planner)(cfg, limits)

    @classmethod
    def check_settings(cls, engine: Any) -> None:
        """Refuses, in one line, settings of its own that cannot go together (its capabilities refuse
        the others' settings: ``unhonoured``)."""

    @classmethod
    def check_plan(cls, plan: Any) -> None:
        """Refuses, before any work, a plan this kind's engine cannot serve here."""
        _step(cls.plan_check, plan)

    @classmethod
    def prepare(cls, plan: Any) -> None:
        """Loads what its engine needs (our kernels' library) before the run says it is running."""
        _step(cls.preparer, plan)

    @classmethod
    def shared_parts(cls, cfg: Any) -> Any:
        """The engine parts an earlier run of this process left, for its engine to take over; None:
        it takes none (it builds no model of ours, or builds its own)."""
        return _step(cls.sharer, cfg)

    @classmethod
    def warm_up(cls, llm: Any) -> dict[str, int] | None:
        """Runs a throwaway request so that first-call costs stay out of the records; its shape, or
        None where it ran none."""
        return _step(cls.warmer, llm)

    @classmethod
    def parts(cls, llm: Any) -> dict[str, str]:
        """The parts its engine's set-up built or reused (a run records them); none of ours: {}."""
        return {} if cls.parts_built is None else _target(cls.parts_built)(llm)

    @classmethod
    def simulator_times(cls, device: str) -> bool:
        """Whether the simulator's ``device`` was measured from its runs there, so that the simulator
        can stand in for them (a sweep's first estimate of their seconds)."""
        return device in cls.simulator_times_on

    @classmethod
    def timing_caveat(cls, llm: Any) -> str | None:
        """Why its times are unreliable whatever the machine's load; None: only the load can say."""
        return _step(cls.timing_check, llm)

    @classmethod
    def build_batches(cls, llm: Any, scheduler: Any) -> tuple[Any, Any]:
        return _target(cls.batches)(llm, scheduler)

    @classmethod
    def budget_source(cls, engine: Any) -> Any:
        """Whose cost model sizes its ``token_budget=auto``."""
        return _target(cls.budgeter)(engine)

    @classmethod
    def record(cls, engine: Any, device: Any) -> dict[str, Any]:
        """What a run records of its executor: the device measured and its name, or the simulated one."""
        return _target(cls.recorder)(engine, device)


def _target(name: str) -> Any:
    module, _, attributes = name.partition(":")
    found = importlib.import_module(module)
    for attribute in attributes.split("."):
        found = getattr(found, attribute)
    return found


def _step(name: str | None, *args: Any) -> Any:
    """A step a kind names, taken; None where it names none."""
    return None if name is None else _target(name)(*args)


def build(plan: Any, shared: Any = None) -> Any:
    """The engine serving ``plan``: ours (with a model executor or the simulator's) or another.
    ``shared``: the parts an earlier engine of this process left, for an engine that takes them."""
    return _target(executor_class(plan.config.executor).engine)(plan, shared)


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


def recorded_label(name: Any) -> str | None:
    """The engine whose numbers a recorded run holds, where another's ('vLLM'); None: ours, or an
    unknown name or a gap in the records."""
    return _REGISTRY[name].engine_label if recorded_as(name, "engine_label") else None


def executor_class(name: str) -> type[ExecutorKind]:
    return _REGISTRY[name]


@register_executor("model")
class RealModel(ExecutorKind):
    noun = "the engine"
    runs_model = True
    tensor_parallel = pipeline_parallel = True
    preparer = "sarathi_lab.harness.runner:load_kernels"
    sharer = "sarathi_lab.harness.runner:shared_engine"
    warmer = "sarathi_lab.llm:warm_up"
    parts_built = "sarathi_lab.llm:model_parts"
    timing_check = "sarathi_lab.llm:interpreted_times"
    # The simulator's CPU device: ceilings measured of our model on this CPU.
    simulator_times_on = ("cpu",)


@register_executor("sim")
class Simulator(ExecutorKind):
    noun = "the simulator"
    simulated = True
    samples = False
    overlaps = ("none",)
    stages_setting = "sim_pp"
    tags = ("simulated",)
    # Virtual-clock times do not depend on the machine's load.
    load_record: ClassVar[dict[str, Any]] = {"timing_unreliable": False, "timing_note": None}
    planner = "sarathi_lab.plan:plan_simulated"
    batches = "sarathi_lab.llm:simulated_batches"
    recorder = "sarathi_lab.harness.environment:simulated_record"
    budgeter = "sarathi_lab.harness.budget:simulated_budget"
    # A simulation's objects live to its end and make few cycles: fewer collections, and none of
    # their pauses lands in a virtual clock's times.
    gc_gen0_threshold = 50_000

    @classmethod
    def check_settings(cls, engine: Any) -> None:
        """Its cost model against its stages and devices: a profile times one device's whole model."""
        cost = Key("sim_cost_model", "profile")
        if engine.sim_pp > 1 and engine.sim_cost_model == "profile":
            raise ConfigError("sim_pp", engine.sim_pp,
                              "is invalid with " + cost + ": a profile times the whole "
                              "model's layers, not a stage's",
                              "1, or " + Key("sim_cost_model") + "=calibrated or roofline")
        if engine.sim_tp > 1 and engine.sim_cost_model == "profile" and engine.sim_device == "cpu":
            raise ConfigError("sim_tp", engine.sim_tp,
                              "is invalid with " + cost + " on " + Key("sim_device", "cpu")
                              + ": a profile times one device",
                              "1, or " + Key("sim_cost_model") + "=roofline")


@register_executor("vllm")
class Vllm(ExecutorKind):
    noun = "vLLM's engine"
    engine_label = "vLLM"
    cuda_graphs_mixed = kv_watermark = False
    # vLLM's scheduler with chunked prefill is sarathi_serve's batching; off, it is our vllm.
    schedulers = ("sarathi_serve", "vllm")
    attentions = cpu_linears = ("auto",)
    attention_hybrids = ("sequential",)
    overlaps = ("none",)
    plan_check = "sarathi_lab.harness.vllm_args:check_vllm"
    engine = "sarathi_lab.harness.vllm_engine:VllmLLM.from_plan"
    # It takes none of our parts, and sizes its cache by the device's free memory: an earlier job's
    # kept model would be counted against it.
    sharer = "sarathi_lab.harness.runner:release_shared"
    batches = None
    recorder = "sarathi_lab.harness.environment:vllm_record"


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


def llm_refusal(name: str) -> ConfigError | None:
    """Why ``LLM`` cannot drive ``name``: another engine serves it (through the harness)."""
    if executor_class(name).batches is not None:
        return None
    return ConfigError("executor", name, f"is invalid for LLM: {executor_class(name).noun} is "
                       "served by the harness (python -m sarathi_lab.run "
                       f"executor={name})", ", ".join(executors_with("batches")), keys=AS_WRITTEN)


def sampling_refusal(name: str, temperature: float) -> ConfigError | None:
    if not temperature or executor_class(name).samples:
        return None
    return ConfigError("sampling.temperature", temperature, "is invalid with "
                       f"executor={name!r}: {executor_class(name).noun} predicts times, not tokens",
                       "0", keys=AS_WRITTEN)


def stand_in_refusal(name: str, model: str, why: str | None) -> ConfigError | None:
    """A simulator-only preset (``why``: what it stands in for; None: a model) off the simulator."""
    if why is None or executor_class(name).simulated:
        return None
    return ConfigError("model", model, "is invalid with " + Key("executor", name) + f": {why}",
                       Key("executor") + f"={', '.join(executors_with('simulated'))}")


# What a task beyond serving needs: our engine's batches, or (profile) our forwards.
SERVING_TASKS = ("serve", "capacity")
TASK_NEEDS = {"profile": ("runs_model", "runs none of our model's forwards")}
BATCHES_OF_OURS = ("batches", "runs no batch of our engine")


def task_refusal(name: str, task: str) -> ConfigError | None:
    need, lacks = TASK_NEEDS.get(task, BATCHES_OF_OURS)
    if task in SERVING_TASKS or getattr(executor_class(name), need):
        return None
    can = ", ".join(executors_with(need))
    serving = "" if task in TASK_NEEDS else f", or task={', '.join(SERVING_TASKS)}"
    return ConfigError("task", Written(task),
                       f"is invalid with executor={name}: {executor_class(name).noun} {lacks}",
                       f"executor={can}" + serving, keys=AS_WRITTEN)

