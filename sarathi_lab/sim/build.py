"""What the engine's plan asks the simulator for (``executor="sim"``): the KV capacity in blocks and
the cost model, each made once per run; and the executor that runs on them."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from transformers import PretrainedConfig

from sarathi_lab.config import DTYPE_BYTES, ConfigError, EngineConfig
from sarathi_lab.model.memory import kv_excess
from sarathi_lab.model.shape import Shape
from sarathi_lab.sim.cost_model import CostModel
from sarathi_lab.sim.device import device_dtype, load_device
from sarathi_lab.sim.memory import kv_capacity_tokens
from sarathi_lab.sim.parallel import shard

if TYPE_CHECKING:
    from sarathi_lab.engine.clock import VirtualClock

log = logging.getLogger(__name__)


def simulated_kv_blocks(cfg: EngineConfig, config: PretrainedConfig, warn: bool = True) -> int:
    """An explicit block count or memory budget wins, as in the real engine, if it fits on the
    simulated device beside the weights (or, with ``sim_kv_beyond_device``, as a what-if, with a
    warning unless ``warn`` is False); otherwise the device's memory after the weights and the
    activations of the largest iteration a chunking scheduler builds (its chunk or budget plus one
    token per running decode)."""
    # Each of sim_tp GPUs holds its shard's weights and its heads' part of every token's KV.
    try:
        config = shard(config, cfg.sim_tp)
    except ConfigError as e:
        raise ConfigError(f"sim_tp={cfg.sim_tp} is invalid for this model: {e}") from None
    # The engine's element size: bfloat16 runs as float32 on a CPU without bf16 units (torch_dtype).
    elem = DTYPE_BYTES[device_dtype(cfg.sim_device, cfg.dtype)]
    shape = Shape.of(config)
    block_bytes = shape.kv_bytes_per_token(elem) * cfg.block_size
    device = load_device(cfg.sim_device, cfg.dtype)
    key, blocks = cfg.kv_size_key, cfg.explicit_kv_blocks(block_bytes)
    if key is not None:
        room = device.memory_bytes - shape.weight_bytes(elem)
        if blocks * block_bytes > room:
            excess = kv_excess(blocks, block_bytes, room, f"sim_device={cfg.sim_device!r}")
            if not cfg.sim_kv_beyond_device:
                raise ConfigError(f"{key}={getattr(cfg, key)} is invalid: {excess} (sim_kv_beyond_device=true "
                                  "runs it as a what-if)")
            if warn:
                log.warning("what-if KV cache (sim_kv_beyond_device): %s", excess)
        return blocks
    key = "chunk_size" if cfg.chunk_size >= cfg.budget else "token_budget"
    max_tokens = getattr(cfg, key) + cfg.max_batch_size
    try:
        return kv_capacity_tokens(device, config, elem, max_tokens) // cfg.block_size
    except ConfigError as e:
        if e.key != "max_tokens":
            raise
        # Name the setting that made the iteration this large (the harness maps it to the user's key).
        raise ConfigError(f"{key}={getattr(cfg, key)} is invalid on sim_device={cfg.sim_device!r}: an iteration of "
                          f"this many tokens and a decode per running request ({max_tokens} in all) leaves no room "
                          "for a KV cache") from None


def simulated_cost_model(cfg: EngineConfig, config: PretrainedConfig) -> CostModel:
    """The cost model of ``cfg.sim_device`` and ``cfg.sim_cost_model``; a profile not measured yet is
    a ConfigError, refused before the run starts."""
    model = cfg.model if cfg.sim_cost_model == "profile" else config
    try:
        return CostModel.for_device(cfg.sim_device, model, cfg.sim_cost_model, cfg.dtype, tp=cfg.sim_tp)
    except FileNotFoundError as e:
        raise ConfigError(f"sim_cost_model={cfg.sim_cost_model!r} is invalid here: {e}") from None


def simulated_executor(cost_model: CostModel, config: PretrainedConfig, clock: VirtualClock):
    """The SimulatedExecutor that advances ``clock`` by ``cost_model``'s predictions."""
    from sarathi_lab.sim.executor import SimulatedExecutor  # needs the engine's executor seam

    eos = getattr(config, "eos_token_id", None)
    eos = eos[0] if isinstance(eos, list) else eos
    return SimulatedExecutor(cost_model, clock, eos)
