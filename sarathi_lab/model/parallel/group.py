"""The ranks of a tensor-parallel engine and the process groups between them. Rank 0 is the driver
(the process that runs the scheduler); the others are spawned by it, one process each, meeting on
127.0.0.1, or started by torchrun (its RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT,
across nodes too). ``control`` carries the driver's next command and waits as long as the driver
is idle; each engine's ``wire`` (the batch's bytes, gloo over host memory) and ``step`` (the
forward's collectives: NCCL on GPUs, gloo on CPUs) wait at most collective_timeout_s, so that a
rank that died or hangs ends the run with an error, never a hang."""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from sarathi_lab.config import usable_cores

# The driver may be idle between generate calls for as long as its user pleases; a driver that
# dies closes its connections, which ends the other ranks' wait at once.
CONTROL_TIMEOUT = timedelta(days=7)
# The longest the ranks wait for each other to start (import torch, meet): starting takes longer
# than a step's collectives may wait, on a loaded machine tens of seconds.
JOIN_TIMEOUT_S = 300.0
LOOPBACK = "127.0.0.1"


# The longest the driver waits for every rank to build its part of an engine (reading a checkpoint
# of tens of GB included).
BUILD_TIMEOUT_S = 1800.0


def bounded(work, timeout_s: float) -> None:
    """Wait for an asynchronous collective on the control group at most ``timeout_s``: that group's
    own timeout is the other ranks' idle wait, and a gloo send waits for its receiver to be ready."""
    if work.wait(timedelta(seconds=timeout_s)) is False:
        raise TimeoutError(f"no rank answered within {timeout_s:g} s")


def torchrun_rank() -> int | None:
    """This process's rank when torchrun (or any launcher setting its variables) started several; else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ:
        return int(os.environ["RANK"])
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


@dataclass
class RankGroup:
    """This process's place among the ranks, and the processes it spawned (the driver's, when it did)."""
    rank: int
    size: int
    local_rank: int
    control: Any
    processes: list = field(default_factory=list)
    # How errors name the layout (the engine's keys), set when an engine starts.
    label: str = ""
    # How the driver's commands reach the ranks of the engine built last: its pipeline's Chain (every
    # rank then waits for its source's next command, point to point); None: broadcast over all ranks.
    chain: Any = None

    def device(self, device_type: str) -> torch.device:
        """One GPU per rank on a node (its local rank's); the CPU is shared."""
        if device_type == "cuda":
            torch.cuda.set_device(self.local_rank)
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def dead_ranks(self, wait_s: float = 0.0) -> list[tuple[int, int]]:
        """(rank, exit code) of each spawned rank that has ended (``wait_s``: each waited for that
        long, so that one whose connections just closed is reaped before its exit code is read)."""
        dead = []
        for rank, process in enumerate(self.processes, start=1):
            if wait_s:
                process.join(timeout=wait_s)
            if not process.is_alive():
                dead.append((rank, process.exitcode))
        return dead

    def failure(self, error: BaseException, timeout_s: float) -> RuntimeError:
        """What ends the run when a collective fails: the ranks that died, where this process knows
        them (it spawned them; under torchrun its agent names the rank that failed)."""
        why = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        dead = self.dead_ranks(wait_s=1.0)
        if dead:
            who = ", ".join(f"rank {rank} (exit code {code})" for rank, code in dead)
            return RuntimeError(f"{self.label or f'{self.size} ranks'}: {who} died, so the run stops "
                                f"({type(error).__name__}: {why})")
        return RuntimeError(f"{self.label or f'{self.size} ranks'}: a collective failed or waited longer than "
                            f"collective_timeout_s={timeout_s:g} for a rank that died or hangs "
                            f"({type(error).__name__}: {why})")


def join(rank: int, size: int, init_method: str | None = None, local_rank: int | None = None,
         store=None) -> RankGroup:
    """This process joins the ranks (gloo: the control group every device uses), meeting by
    ``init_method`` or on ``store``."""
    dist.init_process_group("gloo", init_method=init_method, store=store, rank=rank, world_size=size,
                            timeout=timedelta(seconds=JOIN_TIMEOUT_S))
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    return RankGroup(rank, size, rank if local_rank is None else local_rank, control)


@dataclass(frozen=True)
class EngineGroups:
    """An engine's groups as this rank sees them: ``wire`` (every rank, gloo), ``step`` (the ranks of
    its pipeline stage: the tensor-parallel collectives) and ``p2p`` (every rank: activations stage
    to stage, logits to the driver), on the device's backend."""
    wire: Any
    step: Any
    p2p: Any


def engine_groups(group: RankGroup, device_type: str, timeout_s: float, tp: int) -> EngineGroups:
    """A new engine's groups, made by every rank in the same order, each bounded by ``timeout_s``."""
    timeout = timedelta(seconds=timeout_s)
    wire = dist.new_group(backend="gloo", timeout=timeout)
    backend = "nccl" if device_type == "cuda" else "gloo"
    p2p = dist.new_group(backend="nccl", timeout=timeout) if device_type == "cuda" else wire
    step = None
    for first in range(0, group.size, tp):  # every stage's group, by every rank, in one order
        ranks = list(range(first, first + tp))
        made = dist.new_group(ranks, backend=backend, timeout=timeout)
        if group.rank in ranks:
            step = made
    return EngineGroups(wire, step, p2p)


def threads_per_rank(size: int, num_threads: int | None) -> int:
    """A CPU's cores shared out among the ranks on it (num_threads, where set, per rank): all ``size``
    of them, or those torchrun started on this node."""
    here = int(os.environ.get("LOCAL_WORLD_SIZE", size)) if torchrun_rank() is not None else size
    return num_threads or max(1, usable_cores() // here)
