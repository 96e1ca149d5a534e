"""A pipeline engine's commands pass point to point along the pipeline: a broadcast would wait for
the busiest stage and run one micro-batch at a time. Each rank forwards a command to rank r + tp,
the pair its activations take, in the same order; the last stage's first rank returns logits."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from sarathi_lab.model.parallel.group import bounded


@dataclass(frozen=True)
class Chain:
    rank: int
    tp: int
    size: int

    @property
    def source(self) -> int:
        return 0 if self.rank < self.tp else self.rank - self.tp

    @property
    def targets(self) -> list[int]:
        peers = list(range(1, self.tp)) if self.rank == 0 else []
        return peers + ([self.rank + self.tp] if self.rank + self.tp < self.size else [])

    @property
    def logits_sender(self) -> int:
        return self.size - self.tp

    def forward(self, tensor: torch.Tensor, group) -> list:
        """Each send held with its tensor, which must not change until waited for."""
        return [(dist.isend(tensor, dst, group=group), tensor) for dst in self.targets]

    def receive(self, tensor: torch.Tensor, group) -> torch.Tensor:
        dist.recv(tensor, src=self.source, group=group)
        return tensor


def wait_all(works: list, timeout_s: float) -> None:
    for work, _ in works:
        bounded(work, timeout_s)
