"""A pipeline stage's part of the forward: stage 0 embeds the batch's tokens, every stage runs its
layers over the hidden states and residual the previous stage sent, the last one normalises the
sampled rows and runs the LM head. The model's own forward (CausalLM.forward) is the same path with
one stage."""
from __future__ import annotations

import time
from typing import NamedTuple

import torch
import torch.distributed as dist

from sarathi_lab.model.parallel.stages import Stage
from sarathi_lab.model.runner import ModelRunner, PreparedBatch


class StageRun(NamedTuple):
    """What a stage did with one micro-batch: the sampled rows' logits (the last stage; else None),
    the sends of its activations still under way ((work, tensor) pairs), and when its compute started
    and ended (time.perf_counter: one clock for every process of a machine)."""
    logits: torch.Tensor | None
    sends: list
    start_s: float
    end_s: float


@torch.inference_mode()
def stage_forward(runner: ModelRunner, stage: Stage, prepared: PreparedBatch, rank: int, tp: int,
                  p2p) -> StageRun:
    """This rank's stage of the forward. Its activations go to the same tensor-parallel rank of the
    next stage (``rank + tp``) without waiting for it to take them: it may still be running the
    previous micro-batch, while this stage could start the next."""
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
            torch.cuda.current_stream().synchronize()  # NCCL's receive returns once queued, not received
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
