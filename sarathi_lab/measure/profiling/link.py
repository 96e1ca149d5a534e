"""The link between two processes of one machine, measured: what a message of n bytes takes from a
send to its receipt over torch.distributed's gloo (TCP over the loopback interface), the way a CPU
pipeline's stages pass their commands, activations and logits. A ping-pong between two processes,
each pinned to one of the given cores as the stages are, at sizes from a header's to a megabyte's;
each size's median one-way time is kept, as the simulator's table (sim/link.py)."""
from __future__ import annotations

import os
import queue
import time

import numpy as np

from sarathi_lab.sim.link import Link

SIZES = (8, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20)
ROUNDS = 50


def _ping_pong(rank: int, port: int, core: int | None, sizes, rounds: int, out) -> None:
    import torch
    import torch.distributed as dist

    if core is not None:
        os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        # sockets and buffers warmed at every size
        _rounds(rank, torch.zeros(max(sizes) // 4), rounds)
        medians = [float(np.median(_rounds(rank, torch.zeros(max(nbytes // 4, 1)), rounds))) / 2
                   for nbytes in sizes]
        if rank == 0:
            out.put(medians)
    finally:
        dist.destroy_process_group()


def _rounds(rank: int, buf, rounds: int) -> list[float]:
    import torch.distributed as dist

    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        else:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        out.append(time.perf_counter() - t0)
    return out


def measure(cores: list[int] | None = None, sizes=SIZES, rounds: int = ROUNDS,
            timeout_s: float = 60.0) -> Link:
    """``cores``: one each; None: wherever the OS puts them."""
    import multiprocessing as mp

    from sarathi_lab.model.parallel.group import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    pinned = list(cores) if cores else [None, None]
    procs = [ctx.Process(target=_ping_pong,
                         args=(r, port, pinned[r % len(pinned)], list(sizes), rounds, out),
                         daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    try:
        medians = out.get(timeout=timeout_s)
    except queue.Empty:
        raise RuntimeError(f"the link's ping-pong between two processes gave no times within "
                           f"{timeout_s:g} s (exit codes {[p.exitcode for p in procs]})") from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return Link(tuple(sizes), tuple(medians))


def main(argv: list[str] | None = None) -> None:
    from sarathi_lab import cli_args

    parser = cli_args.Parser(prog="python -m sarathi_lab.measure link",
                             description=__doc__.splitlines()[0])
    parser.add_argument("--cores", default=None, help="two cores to pin the processes to, e.g. 0,1")
    args = parser.parse_args(argv)
    allowed = sorted(os.sched_getaffinity(0))
    cores = None
    if args.cores is not None:
        parts = args.cores.split(",")
        if len(parts) != 2 or not all(p.strip().isdigit() and int(p) in allowed for p in parts):
            parser.error(f"--cores={args.cores} is invalid: must be two cores this process may run "
                         f"on, from {allowed}, e.g. {allowed[0]},{allowed[-1]}")
        cores = [int(p) for p in parts]
    link = measure(cores)
    print(" ".join(f"{n} B: {s * 1e6:.0f} us;" for n, s in zip(link.sizes, link.seconds)),
          link.describe())
