"""The running machine's ceilings: copy bandwidth, matmul rate, a read-only kernel's bandwidth."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from sarathi_lab.engine.timer import best_time, make_clock, reading_flush, time_interleaved
from sarathi_lab.model.cpu_linear import GEMMS, PackedLinear, gemm_available


@dataclass
class Ceilings:
    # Each the fastest repetition: a ceiling is what the hardware can do.
    copy_gbps: float
    matmul_gflops: float
    dtype: str
    device: str
    threads: int
    copy_mib: int
    matmul_n: int
    clock: str = "wall"


# Far past the caches, and large enough for a GEMM's peak.
FULL = {"copy_mib": 256, "matmul_n": 2048, "reps": 5}
SMOKE = {"copy_mib": 16, "matmul_n": 512, "reps": 2}


def copy_bandwidth_gbps(device: torch.device | str = "cpu", nbytes: int = FULL["copy_mib"] << 20,
                        reps: int = FULL["reps"], clock: str = "wall") -> float:
    """(bytes read + written) / time of a copy far larger than the caches."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.zeros_like(src)  # touched: page faults stay out of the timing
    t = best_time(lambda: dst.copy_(src), reps, make_clock(clock, device))
    return 2 * src.numel() * 4 / t / 1e9


def read_bandwidth_gbps(device: torch.device | str = "cpu", nbytes: int = FULL["copy_mib"] << 20,
                        reps: int = FULL["reps"]) -> float:
    """What a read-only kernel (a decode's attention) can reach; a copy mixes in writes."""
    device = torch.device(device)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    times_ms = time_interleaved({"read": reading_flush(src)}, reps, device, warmup=1)["read"]
    return src.numel() * 4 / (min(times_ms) / 1e3) / 1e9


def matmul_gflops(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                  n: int = FULL["matmul_n"], reps: int = FULL["reps"],
                  clock: str = "wall") -> float:
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    clock_fn = make_clock(clock, device)
    t = best_time(lambda: torch.mm(a, b, out=out), reps, clock_fn)
    if torch.device(device).type == "cpu" and dtype in (torch.float32, torch.bfloat16):
        # The engine's packed CPU linears beat torch.mm on some CPUs: the ceiling is the faster.
        for gemm in (g for g in GEMMS if gemm_available(g, dtype)):
            packed = PackedLinear(nn.Linear(n, n, bias=False, dtype=dtype), gemm)
            with torch.no_grad():
                t = min(t, best_time(partial(packed, a), reps, clock_fn))
    return 2 * n**3 / t / 1e9


def measure_ceilings(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, *,
                     copy_mib: int = FULL["copy_mib"], matmul_n: int = FULL["matmul_n"],
                     reps: int = FULL["reps"], clock: str = "wall") -> Ceilings:
    device = torch.device(device)
    return Ceilings(copy_gbps=copy_bandwidth_gbps(device, copy_mib << 20, reps, clock),
                    matmul_gflops=matmul_gflops(device, dtype, matmul_n, reps, clock),
                    dtype=str(dtype).removeprefix("torch."), device=str(device),
                    threads=torch.get_num_threads(), copy_mib=copy_mib, matmul_n=matmul_n,
                    clock=clock)
