"""One interface for what an iteration costs on a device, whatever predicts it: each prefill chunk
as (chunk tokens, the request's context once the chunk is cached), each decode as its context
(its new token included)."""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sarathi_lab.config import DTYPE_BYTES, DTYPES, SETTING, SIM_COST_MODELS, ConfigError, check_choice
from sarathi_lab.model import PRESETS, load_config
from sarathi_lab.sim import gpu_kernels
from sarathi_lab.sim.device import device_dtype
from sarathi_lab.sim.profiles import profile_path
from sarathi_lab.sim.sharding import shard

if TYPE_CHECKING:
    from sarathi_lab.model.spec import ModelConfig


@dataclass
class IterationCost:
    """Predicted seconds of one iteration, split as the engine records it; ``ops`` splits the
    forward pass. ``extrapolated``: some part lies outside what the prediction was built from.
    Read-only: a cost model may hand out the same one for every iteration of the same composition."""
    prepare_s: float
    forward_s: float
    sample_s: float
    ops: dict[str, float] = field(default_factory=dict)
    extrapolated: bool = False

    @property
    def total_s(self) -> float:
        return self.prepare_s + self.forward_s + self.sample_s


def batch_tokens(prefills: list[tuple[int, int]], decodes: list[int]) -> int:
    """The tokens one forward pass runs: each chunk's, and one a decode."""
    return sum(chunk for chunk, _ in prefills) + len(decodes)


class CostModel(abc.ABC):
    # What results name it by (sim_cost_model's words), and its registry name (register_cost_model).
    name: str
    key: str

    def __init__(self, config: ModelConfig, dtype: str):
        self.config = config
        self.dtype = dtype
        self.elem_bytes = DTYPE_BYTES[dtype]

    @abc.abstractmethod
    def _cost(self, prefills: list[tuple[int, int]], decodes: list[int], num_sampled: int) -> IterationCost: ...

    def iteration_cost(self, prefills=(), decodes=(),
                       num_sampled: int | None = None) -> IterationCost:
        """``num_sampled``: rows that pass through the LM head (default: every request, as if each
        chunk ended its prompt)."""
        prefills, decodes = list(prefills), list(decodes)
        for chunk, context in prefills:
            if chunk < 1 or context < chunk:
                raise ValueError(f"prefill ({chunk}, {context}) is invalid: need 1 <= chunk tokens <= context")
        if decodes and min(decodes) < 1:
            raise ValueError(f"decode context {min(decodes)} is invalid: must be >= 1")
        if not prefills and not decodes:
            return IterationCost(0.0, 0.0, 0.0)
        if num_sampled is None:
            num_sampled = len(prefills) + len(decodes)
        return self._cost(prefills, decodes, num_sampled)

    def iteration_time_s(self, prefills=(), decodes=(), num_sampled: int | None = None) -> float:
        return self.iteration_cost(prefills, decodes, num_sampled).total_s

    @classmethod
    def applies(cls, choice: Choice) -> bool:
        """Whether this cost model answers ``choice`` (PRECEDENCE asks in order; the first that does is built)."""
        return True

    @classmethod
    def build(cls, choice: Choice) -> CostModel:
        raise NotImplementedError(f"{cls.__name__} is not chosen by for_device")

    @staticmethod
    def for_device(device: str, model: str | ModelConfig = "llama2-7b",
                   cost_model: str = "roofline", dtype: str = "bfloat16",
                   profile: str | Path | None = None, tp: int = 1, pp: int = 1) -> CostModel:
        """``model``: a preset name, a Hugging Face config directory or a config. ``profile``: the
        CSV of ``cost_model="profile"`` (default ``profiles/<device>/<model>.csv``, which task=profile
        writes; on a GPU without one, the GPU kernels measured there for this model's shape, with the
        calibrated roofline, or the plain one, for what they lack). ``tp``: GPUs of ``device`` serving
        as one by tensor parallelism (parallel.py), each costed as its shard. Which cost model answers
        is PRECEDENCE's first registered one that applies. ``pp``: pipeline stages, each ``tp`` GPUs
        running its layers (parallel.py's PipelineCostModel over the cost model of one stage). A refusal
        names the engine's settings (sim_device, sim_cost_model, sim_tp, sim_pp, dtype)."""
        config, k = model, SETTING
        if isinstance(model, str):
            # A model whose GPU kernels were measured but which is no preset (Llama-2-70B, Qwen-72B, ...).
            measured_only = model not in PRESETS and model in gpu_kernels.model_shapes().index
            config = gpu_kernels.config_of(model) if measured_only else load_config(model)
        check_choice(k("dtype"), dtype, DTYPES)
        # What the engine runs when asked for dtype there (bfloat16 as float32 on a CPU without bf16
        # units): its element size is what every byte count must use.
        dtype = device_dtype(device, dtype)
        # task=profile's table holds the engine's own times, preferred to other engines' kernels.
        own_table = profile is not None or (isinstance(model, str)
                                            and profile_path(device, model).is_file())
        if tp > 1 and cost_model == "profile" and own_table:
            raise ConfigError(f"{k.set('sim_tp', tp)} is invalid with {k.set('sim_cost_model', cost_model)} "
                              "and a profile measured by task=profile: it times one device running the whole "
                              f"model; allowed: {k('sim_tp')}=1, or {k('sim_cost_model')}=calibrated or "
                              "roofline")
        if pp > 1 and cost_model == "profile":
            raise ConfigError(f"{k.set('sim_pp', pp)} is invalid with {k.set('sim_cost_model', cost_model)}: a "
                              "profile times the whole model's layers, not a stage's; allowed: "
                              f"{k('sim_pp')}=1, or {k('sim_cost_model')}=calibrated or roofline")
        name = model if isinstance(model, str) else ""
        whole, config = config, shard(config, 1, pp, name)  # one stage's layers
        part = shard(config, tp, 1, name)
        check_choice(k("sim_cost_model"), cost_model, SIM_COST_MODELS)
        measured = cost_model == "profile" and device in gpu_kernels.measured_devices()
        choice = Choice(device, model, config, part, cost_model, dtype, profile, own_table, tp,
                        gpu_kernels.model_of(config) if measured else None)
        one = next(_REGISTRY[key].build(choice) for key in PRECEDENCE[cost_model]
                   if _REGISTRY[key].applies(choice))
        stage = one if tp == 1 else _REGISTRY[TENSOR_PARALLEL](one, config, tp, dtype)
        return stage if pp == 1 else _REGISTRY[PIPELINE](stage, whole, tp, pp, dtype)


@dataclass(frozen=True)
class Choice:
    """What for_device was asked, resolved: what each cost model's ``applies`` and ``build`` read."""
    device: str
    model: str | ModelConfig  # as asked: a preset, a directory or a config
    config: ModelConfig  # the whole model (with pipeline stages, one stage's layers of it)
    part: ModelConfig  # what one of ``tp`` GPUs holds of it
    cost_model: str  # sim_cost_model
    dtype: str  # what the device runs
    profile: str | Path | None  # the CSV given for cost_model="profile"
    own_table: bool  # a table task=profile measured (or the one given) is there
    tp: int
    # The model's name among the GPU kernels measured on the device (cost_model="profile" there).
    measured_name: str | None


_REGISTRY: dict[str, type[CostModel]] = {}
# The registered cost model that prices one of several tensor-parallel GPUs' shard as the whole.
TENSOR_PARALLEL = "tensor_parallel"
# The registered cost model of pipeline stages over the cost model of one stage.
PIPELINE = "pipeline"
# Which registered cost models answer each sim_cost_model, the first that applies: the engine's own
# table (task=profile) before other engines' kernels measured on the device, which the roofline completes.
PRECEDENCE = {"roofline": ("roofline",), "calibrated": ("calibrated",),
              "profile": ("profile_table", "gpu_kernels")}


def register_cost_model(key: str):
    """Class decorator: the cost model is found under ``key`` (PRECEDENCE's names); its module is
    imported by the package (sarathi_lab/sim/__init__.py)."""
    def wrap(cls: type[CostModel]) -> type[CostModel]:
        cls.key = key
        _REGISTRY[key] = cls
        return cls
    return wrap
