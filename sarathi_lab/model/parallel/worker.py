"""The loop of every rank but the driver: wait for the driver's command, then build an engine's part,
run a step, or leave. A rank has no scheduler and samples nothing; what fails here ends the process,
whose closed connections end the driver's collectives, which then name this rank."""
from __future__ import annotations

import gc
import os

import torch
import torch.distributed as dist

from sarathi_lab.model.parallel.group import RankGroup, engine_groups, join, torchrun_rank
from sarathi_lab.model.parallel.rank import build_rank, run_step
from sarathi_lab.model.parallel.wire import BUILD, HEADER_LEN, NBYTES, OP, STOP


def spawned(rank: int, size: int, init_method: str) -> None:
    """A rank the driver spawned (multiprocessing's target)."""
    serve(join(rank, size, init_method))


def from_torchrun() -> None:
    """A rank torchrun started, other than rank 0 (which runs the program as usual)."""
    rank = torchrun_rank()
    group = join(rank, int(os.environ["WORLD_SIZE"]), "env://", int(os.environ.get("LOCAL_RANK", rank)))
    serve(group)


def serve(group: RankGroup) -> None:
    header = torch.empty(HEADER_LEN, dtype=torch.int64)
    part, wire = None, None
    while True:
        dist.broadcast(header, 0, group=group.control)
        h = header.tolist()
        if h[OP] == STOP:
            break
        if h[OP] == BUILD:
            spec = [None]
            dist.broadcast_object_list(spec, 0, group=group.control)
            part = None  # the previous engine's shard goes before the next one is built
            gc.collect()
            cfg = spec[0].config
            groups = engine_groups(group, cfg.device_type, cfg.collective_timeout_s, cfg.tensor_parallel)
            wire = groups.wire
            part = build_rank(spec[0], group, groups)
            dist.barrier(group=group.control)  # built: the driver may send steps
            continue
        payload = torch.empty(h[NBYTES], dtype=torch.uint8)
        dist.broadcast(payload, 0, group=wire)
        run_step(part, h, payload)
    dist.destroy_process_group()
