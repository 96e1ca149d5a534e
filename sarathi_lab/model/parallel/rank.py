"""One rank's part of a tensor-parallel engine, the same on the driver and the other ranks: its shard
of the model and of the KV cache (its KV heads, every block), built from the spec the driver sends
once per engine, and the step every rank runs over the batch the driver broadcast."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from sarathi_lab.attention import make_backend
from sarathi_lab.config import EngineConfig
from sarathi_lab.model.host_allocator import reuse_freed_memory
from sarathi_lab.model.loader import build_model
from sarathi_lab.model.parallel.group import RankGroup, threads_per_rank
from sarathi_lab.model.parallel.layers import join_ranks
from sarathi_lab.model.parallel.sharding import TensorShards
from sarathi_lab.model.parallel.wire import decode
from sarathi_lab.model.runner import ModelRunner


@dataclass(frozen=True)
class RankSpec:
    """What every rank builds its part from, decided once by the driver's plan: the one object sent
    pickled, once per engine (each iteration's batch goes as tensors: wire.py)."""
    config: EngineConfig
    model_config: PretrainedConfig
    max_model_len: int
    num_kv_blocks: int
    dtype: torch.dtype


def build_rank(spec: RankSpec, group: RankGroup, step_group) -> ModelRunner:
    """This rank's model shard, joined over ``step_group``, with its KV cache shard, as a runner."""
    cfg = spec.config
    device = group.device(cfg.device_type)
    if device.type == "cpu":
        torch.set_num_threads(threads_per_rank(group.size, cfg.num_threads))
        reuse_freed_memory()
    shards = TensorShards.of(spec.model_config, group.rank, group.size, cfg.model)
    backend = make_backend(cfg.attention, device)
    model = build_model(cfg.model, spec.model_config, backend, spec.max_model_len, spec.dtype, device, cfg.seed,
                        cfg.cpu_linear, shards)
    join_ranks(model, step_group, group.size)
    layers = spec.model_config.num_hidden_layers
    cache = torch.zeros(layers, 2, spec.num_kv_blocks, cfg.block_size, shards.local_kv_heads, shards.head_dim,
                        dtype=spec.dtype, device=device)
    return ModelRunner(model, [(layer[0], layer[1]) for layer in cache], cfg.block_size, device)


def run_step(runner: ModelRunner, header: list[int], payload: torch.Tensor) -> torch.Tensor:
    """The forward of the batch the driver sent; the sampled rows' logits, whole (every rank has them)."""
    prepared = decode(header, payload, runner.device)
    runner.model.backend.plan(prepared.meta, runner.kv_caches[0][0])
    return runner.forward(prepared)
