"""One interface for what an iteration costs on a device, whatever predicts it.

    from sarathi_lab.sim import CostModel
    cm = CostModel.for_device("h100", model="llama2-7b")
    cm.iteration_time_s(prefills=[(chunk_tokens, context_after_chunk), ...], decodes=[context_len, ...])

An iteration is described the way the engine batches it: each prefill chunk's tokens and the
request's context once the chunk is cached, and each decode's context (its new token included).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path

from transformers import PretrainedConfig

from sarathi_lab.config import DTYPE_BYTES, DTYPES, SIM_COST_MODELS, ConfigError


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


def _measured_only(model: str) -> bool:
    """A model whose GPU kernels were measured but which is no preset (Llama-2-70B, Qwen-72B, ...)."""
    from sarathi_lab.model import PRESETS
    from sarathi_lab.sim.gpu_kernels import model_shapes

    return model not in PRESETS and model in model_shapes().index


def _kernels_measured(device: str, config: PretrainedConfig) -> bool:
    from sarathi_lab.sim import gpu_kernels

    return device in gpu_kernels.measured_devices() and gpu_kernels.model_of(config) in gpu_kernels.measured(device)


def _engine_profiled(device: str, model) -> bool:
    """Whether task=profile measured this engine on ``device`` (profiles/<device>/<model>.csv): the
    engine's own times, preferred to other engines' kernels."""
    from sarathi_lab.sim.profile_model import profile_path

    return isinstance(model, str) and profile_path(device, model).is_file()


class CostModel(abc.ABC):
    name: str

    def __init__(self, config: PretrainedConfig, dtype: str):
        self.config = config
        self.dtype = dtype
        self.elem_bytes = DTYPE_BYTES[dtype]

    @abc.abstractmethod
    def _cost(self, prefills: list[tuple[int, int]], decodes: list[int], num_sampled: int) -> IterationCost: ...

    def iteration_cost(self, prefills=(), decodes=(), num_sampled: int | None = None) -> IterationCost:
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

    @staticmethod
    def measured_kernels(device: str, config: PretrainedConfig, dtype: str = "bfloat16", tp: int = 1) -> CostModel:
        """The GPU kernels measured on ``device`` for ``config``'s shape (gpu_kernels.py), the
        calibrated roofline (the plain one where the device has no calibration) for what they lack.
        ``tp`` > 1: one GPU's shard, from the kernels measured at that tensor-parallel degree."""
        from sarathi_lab.sim import gpu_kernels
        from sarathi_lab.sim.device import load_device
        from sarathi_lab.sim.kernel_model import KernelCostModel
        from sarathi_lab.sim.roofline import RooflineCostModel

        dev = load_device(device, dtype)
        name = gpu_kernels.model_of(config)
        have = gpu_kernels.measured(device, tp)
        if name is None or name not in have:
            at = f" at sim_tp={tp}" if tp > 1 else ""
            raise ConfigError(f"sim_cost_model='profile' is invalid for this model on sim_device={device!r}{at}: its "
                              f"GPU kernels were not measured (measured: {', '.join(have) or 'none'}); use "
                              f"{'calibrated' if dev.calibration else 'roofline'}")
        shard = config
        if tp > 1:
            from sarathi_lab.sim.parallel import Parallelism, shard_config

            shard = shard_config(config, Parallelism(tp=tp))
        if dev.calibration is not None:
            from sarathi_lab.sim.calibrated import CalibratedRooflineCostModel

            roofline = CalibratedRooflineCostModel(dev, shard, dtype)
        else:
            roofline = RooflineCostModel(dev, shard, dtype)
        return KernelCostModel(gpu_kernels.kernels(device, name, tp), roofline, shard, dtype,
                               source=f"{device}/{name}{f' tp{tp}' if tp > 1 else ''} (vidur, MIT)")

    @staticmethod
    def for_device(device: str, model: str | PretrainedConfig = "llama2-7b", cost_model: str = "roofline",
                   dtype: str = "bfloat16", profile: str | Path | None = None, tp: int = 1) -> CostModel:
        """``model``: a preset name, a Hugging Face config directory or a config. ``profile``: the
        CSV of ``cost_model="profile"`` (default ``profiles/<device>/<model>.csv``, which task=profile
        writes; on a GPU without one, the GPU kernels measured there for this model, gpu_kernels.py). ``tp``: GPUs of
        ``device`` serving as one by tensor parallelism (parallel.py)."""
        from sarathi_lab.model import load_config
        from sarathi_lab.sim.device import device_dtype, load_device

        config = load_config(model) if isinstance(model, str) and not _measured_only(model) else model
        if isinstance(config, str):
            from sarathi_lab.sim.gpu_kernels import config_of

            config = config_of(model)
        if dtype not in DTYPES:
            raise ConfigError(f"dtype={dtype!r} is invalid: allowed values are {', '.join(DTYPES)}")
        # What the engine runs when asked for dtype there (bfloat16 as float32 on a CPU without bf16
        # units): its element size is what every byte count must use.
        dtype = device_dtype(device, dtype)
        if tp > 1:
            if cost_model == "profile" and (profile is not None or _engine_profiled(device, model)):
                raise ConfigError(f"sim_tp={tp} is invalid with sim_cost_model='profile' and a profile measured by "
                                  "task=profile: it times one device running the whole model; allowed: sim_tp=1, or "
                                  "sim_cost_model=calibrated or roofline")
            from sarathi_lab.sim.parallel import tensor_parallel_cost_model

            return tensor_parallel_cost_model(device, config, cost_model, tp, dtype)
        if cost_model == "roofline":
            from sarathi_lab.sim.roofline import RooflineCostModel

            return RooflineCostModel(load_device(device, dtype), config, dtype)
        if cost_model == "calibrated":
            from sarathi_lab.sim.calibrated import CalibratedRooflineCostModel

            return CalibratedRooflineCostModel(load_device(device, dtype), config, dtype)
        if cost_model == "profile" and profile is None and _kernels_measured(device, config) and not _engine_profiled(
                device, model):
            return CostModel.measured_kernels(device, config, dtype)
        if cost_model == "profile":
            from sarathi_lab.sim.profile_model import ProfileCostModel, profile_path

            path = Path(profile) if profile is not None else profile_path(device, model)
            return ProfileCostModel.from_csv(path, config, dtype)
        raise ConfigError(f"sim_cost_model={cost_model!r} is invalid: allowed values are {', '.join(SIM_COST_MODELS)}")
