"""One rank's part of a parallel engine, the same on the driver and the other ranks."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from transformers import PretrainedConfig

from sarathi_lab.attention import make_backend
from sarathi_lab.config import EngineConfig
from sarathi_lab.model.decoder import CausalLM
from sarathi_lab.model.host_allocator import reuse_freed_memory
from sarathi_lab.model.loader import build_model
from sarathi_lab.model.parallel.group import Chain, EngineGroups, RankGroup, threads_per_rank
from sarathi_lab.model.parallel.sharding import TensorShards
from sarathi_lab.model.parallel.stages import Stage
from sarathi_lab.model.parallel.wire import PREFILL_TOKENS, TOKENS, decode
from sarathi_lab.model.runner import ModelRunner, PreparedBatch

# A stage's timeline per row, as kept and sent (float64), in perf_counter seconds (comparable on
# one machine): command_s host work began; planned_s it ended.
FIELDS = ("micro_batch", "start_s", "end_s", "tokens", "prefill_tokens", "command_s", "planned_s")


class StageTimeline:

    def __init__(self) -> None:
        self.rows: list[tuple[float, ...]] = []
        self.submitted = 0

    def record(self, header: list[int], start_s: float, end_s: float, command_s: float,
               planned_s: float) -> None:
        self.rows.append((self.submitted, start_s, end_s, header[TOKENS], header[PREFILL_TOKENS],
                          command_s, planned_s))
        self.submitted += 1

    def as_tensor(self) -> torch.Tensor:
        return torch.tensor(self.rows, dtype=torch.float64).reshape(-1, len(FIELDS))


@dataclass(frozen=True)
class RankSpec:
    """The one object sent pickled, once per engine; each batch goes as tensors (wire.py)."""
    config: EngineConfig
    model_config: PretrainedConfig
    max_model_len: int
    num_kv_blocks: int
    dtype: torch.dtype
    device_type: str  # the plan's, auto resolved


@dataclass
class RankPart:
    runner: ModelRunner
    rank: int
    tp: int
    stage: Stage | None
    p2p: Any
    chain: Chain | None = None
    timeline: StageTimeline = field(default_factory=StageTimeline)


def build_rank(spec: RankSpec, group: RankGroup, groups: EngineGroups) -> RankPart:
    cfg = spec.config
    tp, pp = cfg.tensor_parallel, cfg.pipeline_parallel
    device = group.device(spec.device_type)
    if device.type == "cpu":
        torch.set_num_threads(threads_per_rank(group.size, cfg.num_threads))
        reuse_freed_memory()
    shards = TensorShards.of(spec.model_config, group.rank % tp, tp, cfg.model)
    stage = (Stage.of(spec.model_config.num_hidden_layers, pp, group.rank // tp, cfg.model)
             if pp > 1 else None)
    backend = make_backend(cfg.attention, device)
    model = build_model(cfg.model, spec.model_config, backend, spec.max_model_len, spec.dtype,
                        device, cfg.seed, cfg.cpu_linear, shards, stage)
    if tp > 1:
        join_ranks(model, groups.step, tp)
    layers = spec.model_config.num_hidden_layers if stage is None else stage.num_layers
    cache = torch.zeros(layers, 2, spec.num_kv_blocks, cfg.block_size, shards.local_kv_heads,
                        shards.head_dim, dtype=spec.dtype, device=device)
    runner = ModelRunner(model, [(layer[0], layer[1]) for layer in cache], cfg.block_size, device)
    chain = Chain(group.rank, tp, group.size) if pp > 1 else None
    return RankPart(runner, group.rank, tp, stage, groups.p2p, chain)


class Joined(nn.Module):
    """Where tensor-parallel ranks join: partial sums all-reduced; with ``gather`` ranks, the whole
    vocabulary's logits gathered on every rank (no ``argmax_rows``: greedy reads the logits)."""

    def __init__(self, linear: nn.Module, group: dist.ProcessGroup | None, gather: int = 0):
        super().__init__()
        self.linear = linear
        self.group = group
        self.gather = gather

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.gather:
            out = self.linear(x)
            dist.all_reduce(out, group=self.group)
            return out
        part = self.linear(x).contiguous()
        parts = [torch.empty_like(part) for _ in range(self.gather)]
        dist.all_gather(parts, part, group=self.group)
        return torch.cat(parts, dim=-1)


def join_ranks(lm: CausalLM, group: dist.ProcessGroup | None, size: int) -> CausalLM:
    """Wrapped after cpu_linear's packing, which replaces the nn.Linear modules these hold."""
    for layer in lm.layers:
        layer.self_attn.o_proj = Joined(layer.self_attn.o_proj, group)
        layer.mlp.down_proj = Joined(layer.mlp.down_proj, group)
    lm.lm_head = Joined(lm.lm_head, group, size)
    return lm


def run_step(part: RankPart, header: list[int], payload: torch.Tensor) -> torch.Tensor:
    runner = part.runner
    prepared = decode(header, payload, runner.device)
    runner.model.backend.plan(prepared.meta, runner.kv_caches[0][0])
    return runner.forward(prepared)


class StageRun(NamedTuple):
    logits: torch.Tensor | None
    sends: list
    start_s: float
    end_s: float


def run_stage(part: RankPart, header: list[int], payload: torch.Tensor,
              command_s: float) -> StageRun:
    """Its sends are under way on return."""
    runner = part.runner
    prepared = decode(header, payload, runner.device)
    runner.model.backend.plan(prepared.meta, runner.kv_caches[0][0])
    planned = time.perf_counter()
    run = stage_forward(part, prepared)
    part.timeline.record(header, run.start_s, run.end_s, command_s, planned)
    if part.rank == part.chain.logits_sender:
        run.sends.append((dist.isend(run.logits, dst=0, group=part.p2p), run.logits))
    return run


@torch.inference_mode()
def stage_forward(part: RankPart, prepared: PreparedBatch) -> StageRun:
    """A stage's part of CausalLM.forward; activations go to ``rank + tp`` unawaited: it may still
    run the last micro-batch."""
    lm, stage, p2p = part.runner.model, part.stage, part.p2p
    tokens = prepared.input_ids.shape[0]
    if stage.is_first:
        start = time.perf_counter()
        hidden, residual = lm.embed_tokens(prepared.input_ids), None
    else:
        like = lm.embed_tokens.weight
        hidden = torch.empty(tokens, lm.config.hidden_size, dtype=like.dtype, device=like.device)
        residual = torch.empty_like(hidden)
        dist.recv(hidden, src=part.rank - part.tp, group=p2p)
        dist.recv(residual, src=part.rank - part.tp, group=p2p)
        if hidden.is_cuda:
            # NCCL's receive returns once queued, not received.
            torch.cuda.current_stream().synchronize()
        start = time.perf_counter()  # waiting for the previous stage is no compute of this one
    for layer, kv_cache in zip(lm.layers, part.runner.kv_caches):
        hidden, residual = layer(prepared.positions, hidden, residual, kv_cache, prepared.meta)
    if not stage.is_last:
        hidden, residual = hidden.contiguous(), residual.contiguous()
        if hidden.is_cuda:
            torch.cuda.current_stream().synchronize()  # the compute's end, not its launch
        end = time.perf_counter()
        sends = [(dist.isend(t, dst=part.rank + part.tp, group=p2p), t) for t in (hidden, residual)]
        return StageRun(None, sends, start, end)
    logits = lm.lm_head(lm.final_norm(hidden, residual, prepared.logits_indices))
    if logits.is_cuda:
        torch.cuda.current_stream().synchronize()
    return StageRun(logits, [], start, time.perf_counter())
