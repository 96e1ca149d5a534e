"""A pipeline stage's part of the forward: stage 0 embeds the batch's tokens, every stage runs its
layers over the hidden states and residual the previous stage sent, the last one normalises the
sampled rows and runs the LM head. The model's own forward (CausalLM.forward) is the same path with
one stage."""
from __future__ import annotations

import torch
import torch.distributed as dist

from sarathi_lab.model.parallel.stages import Stage
from sarathi_lab.model.runner import ModelRunner, PreparedBatch


@torch.inference_mode()
def stage_forward(runner: ModelRunner, stage: Stage, prepared: PreparedBatch, rank: int, tp: int,
                  p2p) -> torch.Tensor | None:
    """This rank's stage of the forward; the sampled rows' logits on the last stage, else None (its
    activations went to the same tensor-parallel rank of the next stage: ``rank + tp``)."""
    lm = runner.model
    tokens = prepared.input_ids.shape[0]
    if stage.is_first:
        hidden, residual = lm.embed_tokens(prepared.input_ids), None
    else:
        like = lm.embed_tokens.weight
        hidden = torch.empty(tokens, lm.config.hidden_size, dtype=like.dtype, device=like.device)
        residual = torch.empty_like(hidden)
        dist.recv(hidden, src=rank - tp, group=p2p)
        dist.recv(residual, src=rank - tp, group=p2p)
    for layer, kv_cache in zip(lm.layers, runner.kv_caches):
        hidden, residual = layer(prepared.positions, hidden, residual, kv_cache, prepared.meta)
    if not stage.is_last:
        dist.send(hidden.contiguous(), dst=rank + tp, group=p2p)
        dist.send(residual.contiguous(), dst=rank + tp, group=p2p)
        return None
    return lm.lm_head(lm.norm((hidden + residual).index_select(0, prepared.logits_indices)))
