"""One rank's part of a tensor-parallel engine, the same on the driver and the other ranks: its shard
of the model and of the KV cache (its KV heads, every block), built from the spec the driver sends
once per engine, and the step every rank runs over the batch the driver broadcast."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from transformers import PretrainedConfig

from sarathi_lab.attention import make_backend
from sarathi_lab.config import EngineConfig
from sarathi_lab.model.host_allocator import reuse_freed_memory
from sarathi_lab.model.loader import build_model
from sarathi_lab.model.parallel.group import EngineGroups, RankGroup, threads_per_rank
from sarathi_lab.model.parallel.layers import join_ranks
from sarathi_lab.model.parallel.pipeline import stage_forward
from sarathi_lab.model.parallel.sharding import TensorShards
from sarathi_lab.model.parallel.stages import Stage
from sarathi_lab.model.parallel.wire import LOGITS, decode
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


@dataclass
class RankPart:
    """This rank's runner, where it sits (global rank; tensor_parallel ranks a stage, rank r in stage
    r // tp), its pipeline stage (None: one stage) and the group activations go stage to stage over."""
    runner: ModelRunner
    rank: int
    tp: int
    stage: Stage | None
    p2p: Any


def build_rank(spec: RankSpec, group: RankGroup, groups: EngineGroups) -> RankPart:
    """This rank's model part (its stage's layers, their tensor shards joined over its stage's group),
    with its KV cache part, as a runner."""
    cfg = spec.config
    tp, pp = cfg.tensor_parallel, cfg.pipeline_parallel
    device = group.device(cfg.device_type)
    if device.type == "cpu":
        torch.set_num_threads(threads_per_rank(group.size, cfg.num_threads))
        reuse_freed_memory()
    shards = TensorShards.of(spec.model_config, group.rank % tp, tp, cfg.model)
    stage = (Stage.of(spec.model_config.num_hidden_layers, pp, group.rank // tp, cfg.model) if pp > 1 else None)
    backend = make_backend(cfg.attention, device)
    model = build_model(cfg.model, spec.model_config, backend, spec.max_model_len, spec.dtype, device, cfg.seed,
                        cfg.cpu_linear, shards, stage)
    if tp > 1:
        join_ranks(model, groups.step, tp)
    layers = spec.model_config.num_hidden_layers if stage is None else stage.num_layers
    cache = torch.zeros(layers, 2, spec.num_kv_blocks, cfg.block_size, shards.local_kv_heads, shards.head_dim,
                        dtype=spec.dtype, device=device)
    runner = ModelRunner(model, [(layer[0], layer[1]) for layer in cache], cfg.block_size, device)
    return RankPart(runner, group.rank, tp, stage, groups.p2p)


def run_step(part: RankPart, header: list[int], payload: torch.Tensor) -> torch.Tensor | None:
    """The forward of the batch the driver sent: the sampled rows' logits, whole, on the driver (and
    the other ranks of the last stage); None on the others."""
    runner = part.runner
    prepared = decode(header, payload, runner.device)
    runner.model.backend.plan(prepared.meta, runner.kv_caches[0][0])
    stage = part.stage
    if stage is None:
        return runner.forward(prepared)
    logits = stage_forward(runner, stage, prepared, part.rank, part.tp, part.p2p)
    sender = (stage.count - 1) * part.tp  # the last stage's first rank hands the driver its logits
    if part.rank == sender:
        dist.send(logits, dst=0, group=part.p2p)
        return None
    if part.rank == 0:
        lm = runner.model
        logits = torch.empty(header[LOGITS], lm.config.vocab_size, dtype=lm.embed_tokens.weight.dtype,
                             device=runner.device)
        dist.recv(logits, src=sender, group=part.p2p)
    return logits
