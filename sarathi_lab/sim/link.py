"""The link between two processes of one machine, measured: what a message of n bytes takes from a
send to its receipt over torch.distributed's gloo (TCP over the loopback interface), the way a CPU
pipeline's stages pass their commands, activations and logits. A ping-pong between two processes,
each pinned to one of the given cores as the stages are, at a few sizes; the fit is latency plus
bytes over bandwidth, from each size's median one-way time.

    python -m sarathi_lab.sim.link [--cores 0,1]
"""
from __future__ import annotations

import argparse
import os
import socket
import time
from dataclasses import dataclass

import numpy as np

SIZES = (8, 64 << 10, 256 << 10, 1 << 20)   # bytes: a header, and activations or logits of a few rows
ROUNDS = 60


@dataclass(frozen=True)
class Link:
    """Seconds of one message: ``latency_s + nbytes / bandwidth`` (bytes per second)."""
    latency_s: float
    bandwidth: float

    def message_s(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth

    def describe(self) -> str:
        return f"{self.latency_s * 1e6:.0f} us + {self.bandwidth / 1e9:.2f} GB/s a message"


def fit(sizes: list[int], one_way_s: list[float]) -> Link:
    """Least squares of latency + bytes / bandwidth through (size, seconds) pairs (a latency below 0,
    within the noise, is taken as 0); refused where the times do not grow with the size."""
    slope, intercept = np.polyfit(np.asarray(sizes, float), np.asarray(one_way_s, float), 1)
    if slope * max(sizes) < 1e-9:   # the largest message's bytes would take under a nanosecond
        raise ValueError(f"one-way times {one_way_s} do not grow with the sizes {sizes}: no bandwidth to fit")
    return Link(latency_s=max(float(intercept), 0.0), bandwidth=1.0 / float(slope))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ping_pong(rank: int, port: int, core: int | None, sizes, rounds: int, out) -> None:
    import torch
    import torch.distributed as dist

    if core is not None:
        os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        _rounds(rank, torch.zeros(max(sizes) // 4), rounds)   # sockets and buffers warmed at every size
        medians = []
        for nbytes in sizes:
            medians.append(float(np.median(_rounds(rank, torch.zeros(max(nbytes // 4, 1)), rounds))) / 2)
        if rank == 0:
            out.put(medians)
    finally:
        dist.destroy_process_group()


def _rounds(rank: int, buf, rounds: int) -> list[float]:
    """Seconds of each of ``rounds`` round trips of ``buf`` between ranks 0 and 1."""
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


def measure(cores: list[int] | None = None, sizes=SIZES, rounds: int = ROUNDS, timeout_s: float = 60.0) -> Link:
    """The link between two fresh processes on ``cores`` (one each; None: wherever the OS puts them)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    pinned = list(cores) if cores else [None, None]
    procs = [ctx.Process(target=_ping_pong, args=(r, port, pinned[r % len(pinned)], list(sizes), rounds, out),
                         daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    try:
        medians = out.get(timeout=timeout_s)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return fit(list(sizes), medians)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sarathi_lab.sim.link", description=__doc__.splitlines()[0])
    parser.add_argument("--cores", default=None, help="two cores to pin the processes to, e.g. 0,1")
    args = parser.parse_args(argv)
    cores = [int(c) for c in args.cores.split(",")] if args.cores else None
    print(measure(cores).describe())


if __name__ == "__main__":
    main()
