"""Where tensor-parallel ranks join: o_proj's and down_proj's partial sums, the LM head's logits."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from sarathi_lab.model.decoder import CausalLM


class AllReduced(nn.Module):

    def __init__(self, linear: nn.Module, group: dist.ProcessGroup | None):
        super().__init__()
        self.linear = linear
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        dist.all_reduce(out, group=self.group)
        return out


class GatheredHead(nn.Module):
    """The whole vocabulary's logits on every rank (no ``argmax_rows``: greedy reads the logits)."""

    def __init__(self, linear: nn.Module, group: dist.ProcessGroup | None, size: int):
        super().__init__()
        self.linear = linear
        self.group = group
        self.size = size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        part = self.linear(x).contiguous()
        parts = [torch.empty_like(part) for _ in range(self.size)]
        dist.all_gather(parts, part, group=self.group)
        return torch.cat(parts, dim=-1)


def join_ranks(lm: CausalLM, group: dist.ProcessGroup | None, size: int) -> CausalLM:
    """Wrapped after cpu_linear's packing, which replaces the nn.Linear modules these hold."""
    for layer in lm.layers:
        layer.self_attn.o_proj = AllReduced(layer.self_attn.o_proj, group)
        layer.mlp.down_proj = AllReduced(layer.mlp.down_proj, group)
    lm.lm_head = GatheredHead(lm.lm_head, group, size)
    return lm
