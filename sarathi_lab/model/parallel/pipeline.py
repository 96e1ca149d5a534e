"""A pipeline stage's part of the forward; CausalLM.forward is the same path with one stage."""
from __future__ import annotations

import time
from typing import NamedTuple

import torch
import torch.distributed as dist

from sarathi_lab.model.parallel.stages import Stage
from sarathi_lab.model.runner import ModelRunner, PreparedBatch


class StageRun(NamedTuple):
    logits: torch.Tensor | None
    sends: list
    start_s: float
    end_s: float


@torch.inference_mode()
def stage_forward(runner: ModelRunner, stage: Stage, prepared: PreparedBatch, rank: int, tp: int,
                  p2p) -> StageRun:
    """Activations sent to ``rank + tp`` unawaited: it may still run the last micro-batch."""
    lm = runner.model
    tokens = prepared.input_ids.shape[0]
    if stage.is_first:
        start = time.perf_counter()
        hidden, residual = lm.embed_tokens(prepared.input_ids), None
    else:
        like = lm.embed_tokens.weight
        hidden = torch.empty(tokens, lm.config.hidden_size, dtype=like.dtype, device=like.device)
        residual = torch.empty_like(hidden)
        dist.recv(hidden, src=rank - tp, group=p2p)
        dist.recv(residual, src=rank - tp, group=p2p)
        if hidden.is_cuda:
            # NCCL's receive returns once queued, not received.
            torch.cuda.current_stream().synchronize()
        start = time.perf_counter()  # waiting for the previous stage is no compute of this one
    for layer, kv_cache in zip(lm.layers, runner.kv_caches):
        hidden, residual = layer(prepared.positions, hidden, residual, kv_cache, prepared.meta)
    if not stage.is_last:
        hidden, residual = hidden.contiguous(), residual.contiguous()
        if hidden.is_cuda:
            torch.cuda.current_stream().synchronize()  # the compute's end, not its launch
        end = time.perf_counter()
        sends = [(dist.isend(t, dst=rank + tp, group=p2p), t) for t in (hidden, residual)]
        return StageRun(None, sends, start, end)
    logits = lm.lm_head(lm.final_norm(hidden, residual, prepared.logits_indices))
    if logits.is_cuda:
        torch.cuda.current_stream().synchronize()
    return StageRun(logits, [], start, time.perf_counter())
