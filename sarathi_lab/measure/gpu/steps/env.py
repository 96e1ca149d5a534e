"""The machine and its ceilings (measure/profiling/ceilings.py), which the floors read."""
from __future__ import annotations

import os
import platform
import subprocess

from sarathi_lab.harness.results import read_json, write_json
from sarathi_lab.measure.gpu.context import Context
from sarathi_lab.measure.gpu.state import Metric, step_dir
from sarathi_lab.measure.gpu.steps import Declared

STEP = Declared(
    order=10, minutes=0.3, paths=("sarathi_lab/measure/profiling/ceilings.py",),
    what="device, driver, versions; copy bandwidth (1 GiB device copy), read bandwidth (a sum over "
         "1 GiB) and bf16 matmul rate (8192^3 torch.mm), fastest of 20 "
         "(measure/profiling/ceilings.py)")

# GPU: a buffer far past L2 and the paper's matmul; dry run: seconds on two cores.
COPY_BYTES = {"cuda": 1 << 30, "cpu": 64 << 20}
MATMUL_N = {"cuda": 8192, "cpu": 256}


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except ImportError:
        return "absent"


def describe(device: str) -> dict:
    import torch
    from sarathi_kernels import plan_native

    record = {"python": platform.python_version(), "torch": torch.__version__,
              "triton": _version("triton"),
              "transformers": _version("transformers"), "hydra": _version("hydra"),
              "torch_cuda": torch.version.cuda,
              "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
              "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
              # How the host plans balanced attention work (built here, before any timed step).
              "host_planner": plan_native.planner(),
              "device": "cpu"}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        try:
            smi = subprocess.run(["nvidia-smi",
                                  "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                  "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=30, check=False).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            smi = "nvidia-smi not available"
        record |= {"device": props.name, "nvidia_smi": smi, "sms": props.multi_processor_count,
                   "memory_gib": round(props.total_memory / 2**30, 1),
                   "capability": f"{props.major}.{props.minor}",
                   "l2_mb": round(getattr(props, "L2_cache_size", 0) / 1e6, 1)}
    return record


def measure_ceilings(device: str) -> dict:
    import torch

    from sarathi_lab.measure.profiling.ceilings import (
        copy_bandwidth_gbps,
        matmul_gflops,
        read_bandwidth_gbps,
    )

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return {"copy_gbps": copy_bandwidth_gbps(device, COPY_BYTES[device], reps=20),
            "read_gbps": read_bandwidth_gbps(device, COPY_BYTES[device], reps=20),
            "matmul_tflops": matmul_gflops(device, dtype, MATMUL_N[device], reps=20) / 1e3,
            "matmul_dtype": str(dtype).removeprefix("torch."), "matmul_n": MATMUL_N[device],
            "copy_bytes": COPY_BYTES[device]}


def run(ctx: Context, step) -> tuple[list[Metric], list[str]]:
    record = describe(ctx.device) | measure_ceilings(ctx.device)
    write_json(ctx.dir / "env.json", record)
    rates = {"copy_gbps": "GB/s", "read_gbps": "GB/s", "matmul_tflops": "TFLOP/s"}
    metrics = [Metric(k, v) for k, v in record.items() if k not in rates]
    return metrics + [Metric(k, float(f"{record[k]:.4g}"), unit) for k, unit in rates.items()], []


def ceilings(out) -> dict | None:
    """The env step's record (None before it ran)."""
    return read_json(step_dir(out, "env") / "env.json")


def ceilings_or_measured(ctx: Context) -> tuple[dict, bool]:
    """The env step's ceilings, else measured here; and whether they were."""
    record = ceilings(ctx.out)
    return (record, False) if record else (measure_ceilings(ctx.device), True)
