"""Where tensor-parallel ranks join: o_proj's and down_proj's partial sums, the LM head's logits."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from sarathi_lab.model.decoder import CausalLM


class Joined(nn.Module):
    """Partial sums all-reduced; with ``gather`` ranks, the whole vocabulary's logits gathered on
    every rank (no ``argmax_rows``: greedy reads the logits)."""

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
