"""One run's engine plan, made once: LLM and the preflight agree on what fits."""
from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sarathi_lab.config import (
    ENGINE_FIELDS,
    SETTING,
    ConfigError,
    EngineConfig,
    attention_backend,
    check_attention_hybrid,
)
from sarathi_lab.engine.block_manager import BlockManager
from sarathi_lab.engine.scheduler import Scheduler, SchedulerConfig, scheduler_class, scheduler_config
from sarathi_lab.host_features import (
    cpu_has_onednn_fp16,
    cuda_available,
    resolve_device,
    run_dtype,
    usable_cores,
)
from sarathi_lab.model import load_config
from sarathi_lab.model.configs import check_buildable
from sarathi_lab.model.memory import context_limit, device_memory_bytes, plan_kv_blocks
from sarathi_lab.model.parallel.sharding import rank_memory_config
from sarathi_lab.model.parallel.stages import Stage
from sarathi_lab.model.shape import Shape
from sarathi_lab.sim import simulated_cost_model, simulated_kv_blocks
from sarathi_lab.sim.device import simulated_dtype

if TYPE_CHECKING:
    import torch

    from sarathi_lab.model.spec import ModelConfig
    from sarathi_lab.sim.device import SimulatedDtype

log = logging.getLogger("sarathi_lab")


@dataclass(frozen=True)
class ModelLimits:
    config: ModelConfig
    max_model_len: int

    @classmethod
    def of(cls, cfg: EngineConfig) -> ModelLimits:
        check_buildable(cfg.model, cfg.executor)
        config = load_config(cfg.model)
        return cls(config, context_limit(cfg, config))


@dataclass(frozen=True)
class HostFacts:
    """What the plan probed of this machine (a config probes nothing); None: not probed."""
    cores: int
    device_type: str | None  # auto resolved; None for a simulated device
    cuda_devices: int | None = None
    cpu_fp16: bool | None = None


def probe_host(cfg: EngineConfig) -> HostFacts:
    """The device a model of ours (or vLLM's) runs on here, and what it can run."""
    cores, k = _usable_cores(cfg), SETTING
    if cfg.device == "cuda" and not cuda_available():
        raise ConfigError(f"{k.set('device', 'cuda')} is invalid: no CUDA device is available; "
                          "allowed here: auto, cpu")
    device_type = resolve_device(cfg.device)
    fp16 = _check_cpu_dtype(cfg) if device_type == "cpu" else None
    check_attention_hybrid(cfg.attention_hybrid, attention_backend(cfg.attention, device_type))
    gpus = _check_ranks_fit(cfg, device_type, cores) if cfg.world_size > 1 else None
    return HostFacts(cores, device_type, gpus, fp16)


def _usable_cores(cfg: EngineConfig) -> int:
    cores, k = usable_cores(), SETTING
    # More threads than cores time their waits for a core, and thousands crashed OpenMP's runtime.
    if cfg.num_threads is not None and cfg.num_threads > cores:
        raise ConfigError(f"{k.set('num_threads', cfg.num_threads)} is invalid: this process may "
                          f"run on {cores} cores, so at most {cores}")
    return cores


def _check_ranks_fit(cfg: EngineConfig, device_type: str, cores: int) -> int | None:
    """One device per rank (ranks sharing a core would take turns in every collective)."""
    ranks, gpus = cfg.world_size, None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        ranks = int(os.environ.get("LOCAL_WORLD_SIZE", ranks))
    if device_type == "cuda":
        import torch

        gpus = have = torch.cuda.device_count()
        what = "CUDA devices"
    else:
        have, what = cores, "cores this process may run on"
    if ranks > have:
        k, key = SETTING, "tensor_parallel" if cfg.pipeline_parallel == 1 else "pipeline_parallel"
        raise ConfigError(f"{k.set(key, getattr(cfg, key))} is invalid "
                          f"({k.set('tensor_parallel', cfg.tensor_parallel)} x "
                          f"{k.set('pipeline_parallel', cfg.pipeline_parallel)} ranks): one rank "
                          f"per device needs {ranks} {what} here, and there are {have}; "
                          f"allowed: at most {have} ranks")
    return gpus


def _check_cpu_dtype(cfg: EngineConfig) -> bool | None:
    """float16's packed linear needs oneDNN's float16; None where float16 is not asked for."""
    if cfg.dtype != "float16" or cfg.cpu_linear == "aten":
        return None
    if not (fp16 := cpu_has_onednn_fp16()):
        raise ConfigError(f"{SETTING.set('dtype', 'float16')} is invalid: this CPU's oneDNN has no "
                          "float16 matmul (it needs avx_ne_convert or avx512_fp16); allowed here: "
                          f"bfloat16, float32, or float16 with {SETTING('cpu_linear')}=aten")
    return fp16


@dataclass(frozen=True)
class EnginePlan:
    config: EngineConfig
    model_config: ModelConfig
    shape: Shape
    max_model_len: int
    # What sized the KV cache is what the run schedules by.
    scheduler_config: SchedulerConfig
    num_kv_blocks: int
    dtype: torch.dtype | SimulatedDtype
    host: HostFacts
    cost_model: Any = None

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_kv_blocks * self.config.block_size

    @property
    def device(self) -> torch.device | None:
        """The device the model runs on; None for a simulated one."""
        if self.host.device_type is None:
            return None
        import torch

        return torch.device(self.host.device_type)


def plan_engine(cfg: EngineConfig, limits: ModelLimits | None = None) -> EnginePlan:
    """``limits``: the model's, when already read. Planned as the executor's kind plans: on this
    host's device (``plan_on_device``), or on a simulated one (``plan_simulated``)."""
    return cfg.kind.plan(cfg, limits)


def plan_on_device(cfg: EngineConfig, limits: ModelLimits | None = None) -> EnginePlan:
    host = probe_host(cfg)
    hf, context, sched = _model_and_scheduler(cfg, limits)
    import torch

    dtype, device = torch_run_dtype(cfg.dtype, host.device_type), torch.device(host.device_type)
    per_rank, available = hf, None
    if cfg.world_size > 1:
        # Each rank's weights and KV heads (the first stage's, the most); CPU ranks share memory.
        per_rank = rank_memory_config(hf, cfg.tensor_parallel, cfg.model)
        first = Stage.of(hf.num_hidden_layers, cfg.pipeline_parallel, 0, cfg.model)
        per_rank.num_hidden_layers = first.num_layers
        available = device_memory_bytes(device) // cfg.world_size if device.type == "cpu" else None
    blocks = plan_kv_blocks(cfg, per_rank, sched, context, dtype, device, available)
    return EnginePlan(cfg, hf, Shape.of(hf), context, sched, blocks, dtype, host)


def plan_simulated(cfg: EngineConfig, limits: ModelLimits | None = None) -> EnginePlan:
    # This machine's features decide nothing unless the simulated device is this CPU.
    cores = _usable_cores(cfg)
    host = HostFacts(cores, None, cpu_fp16=_check_cpu_dtype(cfg) if cfg.sim_device == "cpu" else None)
    hf, context, sched = _model_and_scheduler(cfg, limits)
    # Blocks first: they refuse, naming sim_tp, a model that does not split across the GPUs.
    blocks = simulated_kv_blocks(cfg, hf, sched, context)
    dtype = simulated_dtype(cfg.sim_device, cfg.dtype)
    return EnginePlan(cfg, hf, Shape.of(hf), context, sched, blocks, dtype, host,
                      simulated_cost_model(cfg, hf))


def _model_and_scheduler(cfg: EngineConfig, limits: ModelLimits | None
                         ) -> tuple[ModelConfig, int, SchedulerConfig]:
    limits = limits or ModelLimits.of(cfg)
    return limits.config, limits.max_model_len, scheduler_config_of(cfg, limits.max_model_len)


def torch_run_dtype(dtype: str, device_type: str) -> torch.dtype:
    """What runs for ``dtype`` on this host; bfloat16 running as float32 is said once."""
    import torch

    if (runs := run_dtype(dtype, device_type)) != dtype:
        _warn_bf16_fallback()
    return getattr(torch, runs)


@functools.cache
def _warn_bf16_fallback() -> None:
    # Not warnings.warn: one line, once per process, without a source line.
    log.warning("dtype='bfloat16' runs as float32: this CPU has no bf16 matrix instructions")


def scheduler_config_of(cfg: EngineConfig, max_model_len: int) -> SchedulerConfig:
    """The one place settings and knobs become the scheduler's typed config."""
    settings = {name: getattr(cfg, name) for name in ENGINE_FIELDS}
    settings |= {"max_model_len": max_model_len}
    return scheduler_config(cfg.scheduler, cfg.scheduler_knobs, **settings)


def build_scheduler(plan: EnginePlan) -> Scheduler:
    """Over a fresh block manager; refuses a cache that cannot hold one request's reserve."""
    cfg = plan.config
    blocks = BlockManager(plan.num_kv_blocks, cfg.block_size, cfg.kv_watermark)
    scheduler = scheduler_class(cfg.scheduler)
    if (why := scheduler.cache_refusal(plan.scheduler_config, blocks)) is not None:
        raise ConfigError(f"{kv_size_setting(cfg)} is invalid{why}{kv_size_note(cfg)}")
    return scheduler(plan.scheduler_config, blocks)


def kv_size_setting(cfg: EngineConfig) -> str:
    key = cfg.kv_size_key or "num_kv_blocks"
    return SETTING.set(key, getattr(cfg, key))


def kv_size_note(cfg: EngineConfig) -> str:
    if cfg.kv_size_key is not None:
        return ""
    return f" (its default size; {SETTING('num_kv_blocks')} sets it)"

