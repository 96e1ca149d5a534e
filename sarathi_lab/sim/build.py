"""What the plan asks the simulator for: KV blocks by the engine's rule, and the cost model."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sarathi_lab.config import (
    AS_WRITTEN,
    GPU_MEMORY_UTILISATION,
    ConfigError,
    EngineConfig,
    Key,
    check_choice,
    check_count,
)
from sarathi_lab.engine.scheduler import SchedulerConfig
from sarathi_lab.model.memory import (
    default_kv_blocks,
    gpu_kv_bytes,
    kv_excess,
    resident_weight_bytes,
    tokens_with_activations,
)
from sarathi_lab.model.shape import Shape
from sarathi_lab.sim.cost_model import CostModel
from sarathi_lab.sim.device import DEVICES, Device, device_type, load_device, simulated_dtype
from sarathi_lab.sim.sharding import shard

if TYPE_CHECKING:
    from sarathi_lab.model.spec import ModelConfig

log = logging.getLogger(__name__)


def _kv_bytes(device: Device, config: ModelConfig, elem_bytes: int, max_tokens: int,
              utilisation: float) -> int:
    """Refuses (one line) weights that leave no room."""
    # NaN compares false both ways: unchecked it became int(nan) deep below, or 0 bytes.
    number = isinstance(utilisation, (int, float)) and not isinstance(utilisation, bool)
    if not number or not 0 < utilisation <= 1:
        raise ConfigError("utilisation", utilisation, "is invalid: must be a number in (0, 1]",
                          keys=AS_WRITTEN)
    s = Shape.of(config)
    weights = s.weight_bytes(elem_bytes)
    kv_bytes = gpu_kv_bytes(s, elem_bytes, device.memory_bytes, weights, 0, utilisation)
    if kv_bytes < s.kv_bytes_per_token(elem_bytes):
        usable = int(device.memory_bytes * utilisation)
        raise ConfigError("sim_device", device.name,
                          f"is invalid for this model: {weights / 2**30:.1f} GiB of weights leave "
                          f"no room for a KV cache in {usable / 2**30:.1f} GiB", keys=AS_WRITTEN)
    return gpu_kv_bytes(s, elem_bytes, device.memory_bytes, weights, max_tokens, utilisation)


def kv_capacity_tokens(device: Device, config: ModelConfig, elem_bytes: int = 2,
                       max_tokens: int = 0, utilisation: float = GPU_MEMORY_UTILISATION) -> int:
    """The paper's arithmetic, in shapes alone; one line when nothing fits."""
    check_count("max_tokens", max_tokens, 0, AS_WRITTEN)
    free = _kv_bytes(device, config, elem_bytes, max_tokens, utilisation)
    kv = Shape.of(config).kv_bytes_per_token(elem_bytes)
    if free < kv:
        raise ConfigError("max_tokens", max_tokens,
                          f"is invalid on sim_device={device.name!r}: the activations of an "
                          "iteration this large leave no room for a KV cache", keys=AS_WRITTEN)
    return free // kv


def max_batch(device: Device, config: ModelConfig, seq_len: int, elem_bytes: int = 2,
              utilisation: float = GPU_MEMORY_UTILISATION) -> int:
    """The paper's B: requests whose KV fits beside prefilling them all at once."""
    check_count("seq_len", seq_len, 1, AS_WRITTEN)
    free = _kv_bytes(device, config, elem_bytes, 0, utilisation)
    return tokens_with_activations(Shape.of(config), elem_bytes, free) // seq_len


def simulated_kv_blocks(cfg: EngineConfig, config: ModelConfig, sched: SchedulerConfig,
                        context: int) -> int:
    """An explicit count or budget if it fits (or, ``sim_kv_beyond_device``, as a what-if)."""
    check_choice("sim_device", cfg.sim_device, DEVICES)
    # One GPU holds its shard of its stage's weights and KV: its capacity is the engine's.
    config = shard(config, cfg.sim_tp, cfg.sim_pp, cfg.model)
    dtype, kind = simulated_dtype(cfg.sim_device, cfg.dtype), device_type(cfg.sim_device)
    shape, elem = Shape.of(config), dtype.itemsize
    block_bytes = shape.kv_bytes_per_token(elem) * cfg.block_size
    device = load_device(cfg.sim_device, cfg.dtype)
    weights = resident_weight_bytes(cfg, shape, context, dtype, kind)
    key, blocks = cfg.kv_size_key, cfg.explicit_kv_blocks(block_bytes)
    where = Key("sim_device", cfg.sim_device)
    if key is not None:
        room = device.memory_bytes - weights
        if blocks * block_bytes > room:
            excess = kv_excess(blocks, block_bytes, room, where)
            if not cfg.sim_kv_beyond_device:
                raise ConfigError(key, getattr(cfg, key), "is invalid: " + excess + " ("
                                  + Key("sim_kv_beyond_device") + "=true runs it as a what-if)")
            log.warning("what-if KV cache (sim_kv_beyond_device): %s", excess)
        return blocks
    # Here the device is the setting to change: the model is what is being studied.
    return default_kv_blocks(cfg, sched, shape, context, dtype, kind, device.memory_bytes, weights,
                             where, too_large=("sim_device", cfg.sim_device,
                                               "is invalid for this model"))


def simulated_cost_model(cfg: EngineConfig, config: ModelConfig) -> CostModel:
    """A profile not measured yet is refused before the run starts."""
    model = cfg.model if cfg.sim_cost_model == "profile" else config
    try:
        return CostModel.for_device(cfg.sim_device, model, cfg.sim_cost_model, cfg.dtype,
                                    tp=cfg.sim_tp, pp=cfg.sim_pp)
    except FileNotFoundError as e:
        raise ConfigError("sim_cost_model", cfg.sim_cost_model, f"is invalid here: {e}") from None
