"""What an iteration costs: prefill chunks as (tokens, context cached), decodes as context."""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sarathi_lab.config import (
    DTYPE_BYTES,
    DTYPES,
    SIM_COST_MODELS,
    ConfigError,
    Key,
    check_choice,
)
from sarathi_lab.model import PRESETS, load_config
from sarathi_lab.sim import gpu_kernels
from sarathi_lab.sim.device import device_dtype
from sarathi_lab.sim.profiles import profile_path
from sarathi_lab.sim.sharding import shard

if TYPE_CHECKING:
    from sarathi_lab.model.spec import ModelConfig


@dataclass
class IterationCost:
    """Read-only: a cost model may hand out one for every iteration of a composition."""
    prepare_s: float
    forward_s: float
    sample_s: float
    ops: dict[str, float] = field(default_factory=dict)
    extrapolated: bool = False

    @property
    def total_s(self) -> float:
        return self.prepare_s + self.forward_s + self.sample_s


def batch_tokens(prefills: list[tuple[int, int]], decodes: list[int]) -> int:
    return sum(chunk for chunk, _ in prefills) + len(decodes)


class CostModel(abc.ABC):
    # What results name it by (sim_cost_model's words).
    name: str

    def __init__(self, config: ModelConfig, dtype: str):
        self.config = config
        self.dtype = dtype
        self.elem_bytes = DTYPE_BYTES[dtype]

    @abc.abstractmethod
    def _cost(self, prefills: list[tuple[int, int]], decodes: list[int],
              num_sampled: int) -> IterationCost: ...

    def iteration_cost(self, prefills=(), decodes=(),
                       num_sampled: int | None = None) -> IterationCost:
        """``num_sampled``: rows through the LM head (default: every request)."""
        prefills, decodes = list(prefills), list(decodes)
        for chunk, context in prefills:
            if chunk < 1 or context < chunk:
                raise ValueError(f"prefill ({chunk}, {context}) is invalid: need 1 <= chunk tokens "
                                 f"<= context")
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
        """PRECEDENCE asks in order; the first that answers ``choice`` is built."""
        return True

    @classmethod
    def build(cls, choice: Choice) -> CostModel:
        raise NotImplementedError(f"{cls.__name__} is not chosen by for_device")

    @staticmethod
    def for_device(device: str, model: str | ModelConfig = "llama2-7b",
                   cost_model: str = "roofline", dtype: str = "bfloat16",
                   profile: str | Path | None = None, tp: int = 1, pp: int = 1) -> CostModel:
        """``profile``: the CSV for cost_model="profile" (default
        ``profiles/<device>/<model>.csv``); a refusal names the engine's settings."""
        config = model
        if isinstance(model, str):
            # A model whose GPU kernels were measured but which is no preset.
            measured_only = model not in PRESETS and model in gpu_kernels.model_shapes().index
            config = gpu_kernels.config_of(model) if measured_only else load_config(model)
        check_choice("dtype", dtype, DTYPES)
        # The dtype the engine runs there: its element size is every byte count's.
        dtype = device_dtype(device, dtype)
        own_table = profile is not None or (isinstance(model, str)
                                            and profile_path(device, model).is_file())
        others = Key("sim_cost_model") + "=calibrated or roofline"
        if tp > 1 and cost_model == "profile" and own_table:
            raise ConfigError("sim_tp", tp, "is invalid with " + Key("sim_cost_model", cost_model)
                              + " and a profile measured by task=profile: it times one device "
                              "running the whole model", Key("sim_tp") + "=1, or " + others)
        if pp > 1 and cost_model == "profile":
            raise ConfigError("sim_pp", pp, "is invalid with " + Key("sim_cost_model", cost_model)
                              + ": a profile times the whole model's layers, not a stage's",
                              Key("sim_pp") + "=1, or " + others)
        name = model if isinstance(model, str) else ""
        whole, config = config, shard(config, 1, pp, name)
        part = shard(config, tp, 1, name)
        check_choice("sim_cost_model", cost_model, SIM_COST_MODELS)
        measured = cost_model == "profile" and device in gpu_kernels.measured_devices()
        choice = Choice(device, model, config, part, cost_model, dtype, profile, own_table, tp,
                        gpu_kernels.model_of(config) if measured else None)
        one = next(_REGISTRY[key].build(choice) for key in PRECEDENCE[cost_model]
                   if _REGISTRY[key].applies(choice))
        stage = one if tp == 1 else _REGISTRY[TENSOR_PARALLEL](one, config, tp, dtype)
        return stage if pp == 1 else _REGISTRY[PIPELINE](stage, whole, tp, pp, dtype)


@dataclass(frozen=True)
class Choice:
    """What for_device was asked, resolved."""
    device: str
    model: str | ModelConfig
    config: ModelConfig  # with pipeline stages, one stage's layers
    part: ModelConfig
    cost_model: str
    dtype: str
    profile: str | Path | None
    own_table: bool  # a table task=profile measured (or the one given) is there
    tp: int
    # The model's name among the GPU kernels measured on the device.
    measured_name: str | None


_REGISTRY: dict[str, type[CostModel]] = {}
TENSOR_PARALLEL = "tensor_parallel"
# Cost models of data-sheet arithmetic alone: their all-reduce is too, never a measured one.
ANALYTIC = ("roofline", "floor")
PIPELINE = "pipeline"
# The engine's own table (task=profile) before other engines' kernels.
PRECEDENCE = {"roofline": ("roofline",), "calibrated": ("calibrated",), "floor": ("floor",),
              "profile": ("profile_table", "gpu_kernels")}


def register_cost_model(key: str):
    """The module must be imported by sarathi_lab/sim/__init__.py to be found."""
    def wrap(cls: type[CostModel]) -> type[CostModel]:
        _REGISTRY[key] = cls
        return cls
    return wrap
