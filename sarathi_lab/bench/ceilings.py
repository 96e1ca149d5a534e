"""The machine's ceilings: copy bandwidth and matmul rate, measured on the running machine.

Every benchmark of this package records them next to its numbers: a time is only meaningful as a
ratio to what the hardware can do (see ``sarathi_lab.bench.floors``).

    python -m sarathi_lab.bench.ceilings             # 256 MiB copy, 2048^3 matmul, float32
    python -m sarathi_lab.bench.ceilings --smoke
"""
from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass

import torch

from sarathi_lab.bench.common import (
    add_common_args,
    describe_machine,
    median_time,
    print_table,
    resolve_dtype,
    setup_threads,
)


@dataclass
class Ceilings:
    # Bytes read plus bytes written per second by a large tensor copy (fastest of the repetitions:
    # a ceiling is what the hardware can do; the same for the matmul).
    copy_gbps: float
    # Dense matmul rate (2 * m * n * k per second) of a large square matmul in ``dtype``.
    matmul_gflops: float
    dtype: str
    device: str
    threads: int
    copy_mib: int
    matmul_n: int
    clock: str = "wall"

    def as_dict(self) -> dict:
        return asdict(self)


def _sync_for(device: torch.device):
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def copy_bandwidth_gbps(device: torch.device, nbytes: int = 256 << 20, reps: int = 5, clock: str = "wall") -> float:
    """(bytes read + bytes written) / time of ``dst.copy_(src)`` on a buffer far larger than the caches."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.zeros_like(src)  # touched: page faults stay out of the timing
    t = median_time(lambda: dst.copy_(src), reps, sync=_sync_for(device), clock=clock, best=True)
    return 2 * src.numel() * 4 / t / 1e9


def matmul_gflops(device: torch.device, dtype: torch.dtype, n: int = 2048, reps: int = 5,
                  clock: str = "wall") -> float:
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    t = median_time(lambda: torch.mm(a, b, out=out), reps, sync=_sync_for(device), clock=clock, best=True)
    return 2 * n**3 / t / 1e9


def measure_ceilings(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, *,
                     copy_mib: int = 256, matmul_n: int = 2048, reps: int = 5, clock: str = "wall") -> Ceilings:
    device = torch.device(device)
    return Ceilings(copy_gbps=copy_bandwidth_gbps(device, copy_mib << 20, reps, clock),
                    matmul_gflops=matmul_gflops(device, dtype, matmul_n, reps, clock),
                    dtype=str(dtype).removeprefix("torch."), device=str(device),
                    threads=torch.get_num_threads(), copy_mib=copy_mib, matmul_n=matmul_n, clock=clock)


SMOKE = {"copy_mib": 16, "matmul_n": 512, "reps": 2}


def main(argv: list[str] | None = None) -> Ceilings:
    parser = argparse.ArgumentParser(prog="python -m sarathi_lab.bench.ceilings", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_common_args(parser, clock=True)
    parser.add_argument("--copy-mib", type=int, default=256, help="size of the copied buffer")
    parser.add_argument("--matmul-n", type=int, default=2048, help="side of the square matmul")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    setup_threads(args.threads)
    kw = SMOKE if args.smoke else {"copy_mib": args.copy_mib, "matmul_n": args.matmul_n, "reps": args.reps}
    ceil = measure_ceilings(args.device, resolve_dtype(args), **kw, clock=args.clock)
    print(describe_machine())
    print_table([ceil.as_dict()], args.out)
    return ceil


if __name__ == "__main__":
    main()
