"""Every non-driver rank's loop; a failure ends the process, whose closed links end the driver's."""
from __future__ import annotations

import gc
import time

import torch
import torch.distributed as dist

from sarathi_lab.model.parallel.group import (
    RankGroup,
    engine_groups,
    join_torchrun,
    torchrun_rank,
    wait_all,
)
from sarathi_lab.model.parallel.rank import RankPart, build_rank, run_stage, run_step
from sarathi_lab.model.parallel.wire import BUILD, HEADER_LEN, NBYTES, OP, STEP, STOP, TIMELINE

# Leaving, no engine's collective_timeout_s applies: none may be built.
LEAVE_TIMEOUT_S = 10.0


def from_torchrun() -> None:
    serve(join_torchrun(torchrun_rank()))


def serve(group: RankGroup) -> None:
    part: RankPart | None = None
    wire, timeout_s = None, LEAVE_TIMEOUT_S
    # The previous micro-batch's sends, awaited after this one runs: compute never waits on them.
    pending: list = []
    while True:
        chain = part.chain if part is not None else None
        header = torch.empty(HEADER_LEN, dtype=torch.int64)
        if chain is None:
            dist.broadcast(header, 0, group=group.control)
        else:
            chain.receive(header, group.control)  # as long as the driver is idle
        command_s = time.perf_counter()
        h = header.tolist()
        forwards = chain.forward(header, group.control) if chain is not None else []
        if h[OP] == STEP and chain is not None:
            payload = chain.receive(torch.empty(h[NBYTES], dtype=torch.uint8), wire)
            forwards += chain.forward(payload, wire)
            run = run_stage(part, h, payload, command_s)
            wait_all(pending, timeout_s)
            pending = forwards + run.sends
            continue
        wait_all(pending + forwards, timeout_s)  # any other command finds every micro-batch sent on
        pending = []
        if h[OP] == STOP:
            break
        if h[OP] == TIMELINE:
            rows = part.timeline.as_tensor()
            count = torch.tensor([rows.shape[0]], dtype=torch.int64)
            sends = [(dist.isend(count, 0, group=wire), count)]
            if rows.shape[0]:
                sends.append((dist.isend(rows, 0, group=wire), rows))
            wait_all(sends, timeout_s)
            continue
        if h[OP] == BUILD:
            spec = [None]
            dist.broadcast_object_list(spec, 0, group=group.control)
            part = None  # the previous engine's shard goes before the next one is built
            gc.collect()
            cfg = spec[0].config
            groups = engine_groups(group, spec[0].device_type, cfg.collective_timeout_s,
                                   cfg.tensor_parallel)
            wire, timeout_s = groups.wire, cfg.collective_timeout_s
            part = build_rank(spec[0], group, groups)
            dist.barrier(group=group.control)  # built: the driver may send steps
            continue
        payload = torch.empty(h[NBYTES], dtype=torch.uint8)
        dist.broadcast(payload, 0, group=wire)
        run_step(part, h, payload)
    dist.destroy_process_group()
