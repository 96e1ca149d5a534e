"""How a pipeline engine's commands reach its ranks: point to point along the pipeline, never by a
broadcast over every rank, which would wait for the busiest stage and so run one micro-batch at a
time. The driver sends each command (header, then the batch's bytes) to the other ranks of stage 0
and to its own successor; every rank forwards what it receives to its successor, the same
tensor-parallel rank of the next stage (rank r + tensor_parallel), which receives the previous
micro-batch's activations over the same pair in the same order. The last stage's first rank sends
the logits back to the driver."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from sarathi_lab.model.parallel.group import bounded


@dataclass(frozen=True)
class Chain:
    """Rank ``rank`` of ``size`` in stages of ``tp`` ranks (rank r in stage r // tp)."""
    rank: int
    tp: int
    size: int

    @property
    def source(self) -> int:
        """Whom this rank's commands come from: the driver for stage 0, else the previous stage."""
        return 0 if self.rank < self.tp else self.rank - self.tp

    @property
    def targets(self) -> list[int]:
        """Whom this rank forwards each command to: its successor, and for the driver stage 0's others."""
        peers = list(range(1, self.tp)) if self.rank == 0 else []
        return peers + ([self.rank + self.tp] if self.rank + self.tp < self.size else [])

    @property
    def logits_sender(self) -> int:
        """The last stage's first rank, which hands the driver each micro-batch's logits."""
        return self.size - self.tp

    def forward(self, tensor: torch.Tensor, group) -> list:
        """``tensor`` sent on to every target, asynchronously: the works (each holding its tensor, which
        must not change until they are waited for)."""
        return [(dist.isend(tensor, dst, group=group), tensor) for dst in self.targets]

    def receive(self, tensor: torch.Tensor, group) -> torch.Tensor:
        """The next ``tensor`` from this rank's source (waiting as long as ``group`` lets a rank wait)."""
        dist.recv(tensor, src=self.source, group=group)
        return tensor


def wait_all(works: list, timeout_s: float) -> None:
    """Wait for every (work, tensor) that ``Chain.forward`` or a send returned, each at most ``timeout_s``."""
    for work, _ in works:
        bounded(work, timeout_s)
