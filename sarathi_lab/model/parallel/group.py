"""The ranks' process groups: ``control`` waits while the driver idles; an engine's groups at most
collective_timeout_s, so a dead rank ends the run, never hangs it."""
from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from sarathi_lab.host_features import usable_cores
from sarathi_lab.model.configs import first_line

# The driver may idle between generate calls; one that dies closes its connections at once.
CONTROL_TIMEOUT = timedelta(days=7)
# Starting (import torch, meet) takes longer than a step's collectives may wait.
JOIN_TIMEOUT_S = 300.0
LOOPBACK = "127.0.0.1"


# Building a rank's part of an engine may read a checkpoint of tens of GB.
BUILD_TIMEOUT_S = 1800.0


def bounded(work, timeout_s: float) -> None:
    """Bound a control-group wait: its timeout is the ranks' idle wait, and a send waits."""
    if work.wait(timedelta(seconds=timeout_s)) is False:
        raise TimeoutError(f"no rank answered within {timeout_s:g} s")


def torchrun_rank() -> int | None:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ:
        return int(os.environ["RANK"])
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


@dataclass
class RankGroup:
    rank: int
    size: int
    local_rank: int
    control: Any
    processes: list = field(default_factory=list)
    label: str = ""
    # The last engine's pipeline Chain (commands pass point to point); None: broadcast to all.
    chain: Any = None
    # The step under way (step()), if any: the thread waiting on the ranks, for the step watch.
    stepping: int | None = None
    # Why the step watch ended the ranks (spawn.watch_steps), said in place of the failure it made.
    stalled: str = ""

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """While the driver waits on its ranks' part of a step."""
        self.stepping = threading.get_native_id()
        try:
            yield
        finally:
            self.stepping = None

    def device(self, device_type: str) -> torch.device:
        if device_type == "cuda":
            torch.cuda.set_device(self.local_rank)
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def dead_ranks(self, wait_s: float = 0.0) -> list[tuple[int, int]]:
        """``wait_s`` lets a rank whose connections just closed be reaped first."""
        dead = []
        for rank, process in enumerate(self.processes, start=1):
            if wait_s:
                process.join(timeout=wait_s)
            if not process.is_alive():
                dead.append((rank, process.exitcode))
        return dead

    def failure(self, error: BaseException, timeout_s: float) -> RuntimeError:
        """Torchrun's agent names its own dead ranks."""
        if self.stalled:
            return RuntimeError(self.stalled)
        why = first_line(error)[:300]
        dead = self.dead_ranks(wait_s=1.0)
        if dead:
            who = ", ".join(f"rank {rank} (exit code {code})" for rank, code in dead)
            return RuntimeError(f"{self.label or f'{self.size} ranks'}: {who} died, so the run "
                                f"stops ({type(error).__name__}: {why})")
        return RuntimeError(f"{self.label or f'{self.size} ranks'}: a collective failed or waited "
                            f"longer than collective_timeout_s={timeout_s:g} for a rank that died "
                            f"or hangs ({type(error).__name__}: {why})")


def join(rank: int, size: int, init_method: str | None = None, local_rank: int | None = None,
         store=None) -> RankGroup:
    dist.init_process_group("gloo", init_method=init_method, store=store, rank=rank,
                            world_size=size, timeout=timedelta(seconds=JOIN_TIMEOUT_S))
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    return RankGroup(rank, size, rank if local_rank is None else local_rank, control)


def join_torchrun(rank: int) -> RankGroup:
    return join(rank, int(os.environ["WORLD_SIZE"]), "env://",
                int(os.environ.get("LOCAL_RANK", rank)))


@dataclass(frozen=True)
class EngineGroups:
    """``step``: this stage's tensor-parallel collectives; ``p2p``: stage to stage."""
    wire: Any
    step: Any
    p2p: Any


def engine_groups(group: RankGroup, device_type: str, timeout_s: float, tp: int) -> EngineGroups:
    """Made by every rank in the same order (new_group is collective)."""
    timeout = timedelta(seconds=timeout_s)
    wire = dist.new_group(backend="gloo", timeout=timeout)
    backend = "nccl" if device_type == "cuda" else "gloo"
    p2p = dist.new_group(backend="nccl", timeout=timeout) if device_type == "cuda" else wire
    step = None
    for first in range(0, group.size, tp):
        ranks = list(range(first, first + tp))
        made = dist.new_group(ranks, backend=backend, timeout=timeout)
        if group.rank in ranks:
            step = made
    return EngineGroups(wire, step, p2p)


def threads_per_rank(size: int, num_threads: int | None) -> int:
    here = int(os.environ.get("LOCAL_WORLD_SIZE", size)) if torchrun_rank() is not None else size
    return num_threads or max(1, usable_cores() // here)


@dataclass(frozen=True)
class Chain:
    """A pipeline engine's commands pass point to point: a broadcast would wait for the busiest
    stage. Each rank forwards a command to rank r + tp in order; the last stage's first rank
    returns logits."""
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
