"""The link between two processes of one machine, measured: what a message of n bytes takes from a
send to its receipt over torch.distributed's gloo (TCP over the loopback interface), the way a CPU
pipeline's stages pass their commands, activations and logits. A ping-pong between two processes,
each pinned to one of the given cores as the stages are, at sizes from a header's to a megabyte's;
each size's median one-way time is kept, and a message's time is read off that table (linear between
two sizes). A table, not latency + bytes / bandwidth: over TCP on a loopback a message of 64 KiB can
take many times one of 16 KiB and about what one of a megabyte takes, which no straight line follows.

    python -m sarathi_lab.sim.link [--cores 0,1]
"""
from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass

import numpy as np

SIZES = (8, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20)   # bytes
ROUNDS = 50


@dataclass(frozen=True)
class Link:
    """One-way seconds of a message of ``sizes[i]`` bytes: ``seconds[i]``; between two sizes linear, beyond
    the largest on the last two sizes' slope (never below the largest's time)."""
    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.sizes) < 2 or len(self.sizes) != len(self.seconds) or list(self.sizes) != sorted(set(self.sizes)):
            raise ValueError(f"a link needs two or more increasing sizes, each with its seconds: {self.sizes}, "
                             f"{self.seconds}")

    @classmethod
    def linear(cls, latency_s: float, bandwidth: float) -> Link:
        """latency + bytes / bandwidth (bytes per second), as a two-size table."""
        return cls((0, 1 << 20), (latency_s, latency_s + (1 << 20) / bandwidth))

    def message_s(self, nbytes: float) -> float:
        sizes, seconds = self.sizes, self.seconds
        if nbytes <= sizes[-1]:
            return float(np.interp(nbytes, sizes, seconds))
        slope = (seconds[-1] - seconds[-2]) / (sizes[-1] - sizes[-2])
        return seconds[-1] + max(slope, 0.0) * (nbytes - sizes[-1])

    def describe(self) -> str:
        return (f"{self.seconds[0] * 1e6:.0f} us ({self.sizes[0]} B) to {self.seconds[-1] * 1e6:.0f} us "
                f"({self.sizes[-1] / 2**20:g} MiB) a message")


def _ping_pong(rank: int, port: int, core: int | None, sizes, rounds: int, out) -> None:
    import torch
    import torch.distributed as dist

    if core is not None:
        os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        _rounds(rank, torch.zeros(max(sizes) // 4), rounds)   # sockets and buffers warmed at every size
        medians = [float(np.median(_rounds(rank, torch.zeros(max(nbytes // 4, 1)), rounds))) / 2 for nbytes in sizes]
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

    from sarathi_lab.model.parallel.group import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    pinned = list(cores) if cores else [None, None]
    procs = [ctx.Process(target=_ping_pong, args=(r, port, pinned[r % len(pinned)], list(sizes), rounds, out),
                         daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    try:
        medians = out.get(timeout=timeout_s)
    except queue.Empty:
        raise RuntimeError(f"the link's ping-pong between two processes gave no times within {timeout_s:g} s "
                           f"(exit codes {[p.exitcode for p in procs]})") from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return Link(tuple(sizes), tuple(medians))


def main(argv: list[str] | None = None) -> None:
    from sarathi_lab import cli_args

    parser = cli_args.Parser(prog="python -m sarathi_lab.sim.link", description=__doc__.splitlines()[0])
    parser.add_argument("--cores", default=None, help="two cores to pin the processes to, e.g. 0,1")
    args = parser.parse_args(argv)
    allowed = sorted(os.sched_getaffinity(0))
    cores = None
    if args.cores is not None:
        parts = args.cores.split(",")
        if len(parts) != 2 or not all(p.strip().isdigit() and int(p) in allowed for p in parts):
            parser.error(f"--cores={args.cores} is invalid: must be two cores this process may run on, from "
                         f"{allowed}, e.g. {allowed[0]},{allowed[-1]}")
        cores = [int(p) for p in parts]
    link = measure(cores)
    print(" ".join(f"{n} B: {s * 1e6:.0f} us;" for n, s in zip(link.sizes, link.seconds)), link.describe())


if __name__ == "__main__":
    main()
