"""Where a run ran, recorded next to its numbers so that runs from different machines stay comparable."""
from __future__ import annotations

import platform
import sys
from importlib import metadata
from typing import TYPE_CHECKING, Any

from sarathi_lab import code_commit
from sarathi_lab.config import EngineConfig
from sarathi_lab.harness.vllm_args import UNAVAILABLE, vllm_version
from sarathi_lab.profiling.machine import device_name

if TYPE_CHECKING:
    import torch

    from sarathi_lab.sim.device import SimulatedDtype


def collect_environment(engine: EngineConfig, device: torch.device | str, dtype: torch.dtype | SimulatedDtype,
                        cpu_gemm: str | None,
                        load: dict[str, Any], cuda_graphs: dict[str, Any] | None = None) -> dict[str, Any]:
    commit, commit_source = code_commit.source_commit()
    changes = code_commit._git("status", "--porcelain", "--untracked-files=no") if commit_source == "git" else None
    version = code_commit._installed()[0]
    torch = sys.modules.get("torch")  # a simulated run loads none: no threads of it ran
    return {
        **simulated_device(engine),
        # Where it ran: the device measured, or the host that ran the simulation.
        **({"host_device": str(device)} if engine.kind.simulated
           else {"device": str(device), "device_name": device_name(device)}),
        # The dtype that ran, which the engine may have changed (bfloat16 on a CPU without bf16 units).
        "dtype": str(dtype).removeprefix("torch."),
        # The GEMM the CPU's linear layers ran on (model/cpu_linear.py); None off the CPU and in a simulation.
        "cpu_gemm": cpu_gemm,
        # The CUDA graphs forwards replayed (model/cuda_graphs.py's record): decode batch sizes, mixed
        # token buckets, capture seconds, the graphs' pool bytes and memory_reserved before and after
        # capture; None: every forward eager.
        "cuda_graphs": cuda_graphs,
        "torch": torch.__version__ if torch else metadata.version("torch"),
        "python": platform.python_version(),
        "host": platform.node(),
        "torch_threads": torch.get_num_threads() if torch else None,
        **load,
        # The installed package's version (None: a clone never installed), the commit of the code that
        # ran and where that was read (source_commit).
        "sarathi_lab_version": version,
        "git_commit": commit,
        "git_commit_source": commit_source,
        "git_dirty": None if changes is None else bool(changes),  # None: not known
    }


EAGER, GRAPHS, MIXED_GRAPHS = "eager", "decode CUDA graphs", "decode and mixed CUDA graphs"


def graphs_kind(cuda_graphs: Any) -> str:
    """What one run's ``cuda_graphs`` record says replayed: nothing (None), decode-only forwards (the older
    record, a list of decode batch sizes, or a record without mixed buckets), or mixed batches too."""
    if not cuda_graphs:
        return EAGER
    return MIXED_GRAPHS if isinstance(cuda_graphs, dict) and cuda_graphs.get("mixed_tokens") else GRAPHS


def engine_kind(environments: list[dict]) -> str | None:
    """What the engine of a set of measured runs was, from their environment records: 'eager' (every
    forward launched op by op, ``cuda_graphs`` None, or a run from before the record had the key),
    'decode CUDA graphs' (decode-only forwards replayed from graphs), 'decode and mixed CUDA graphs'
    (prefill chunks and hybrids too), joined where runs differ; None for no run."""
    kinds = {graphs_kind(env.get("cuda_graphs")) for env in environments}
    return " and ".join(sorted(kinds)) + (" (runs differ)" if len(kinds) > 1 else "") if kinds else None


def simulated_device(engine: EngineConfig) -> dict[str, Any]:
    """What a run's executor was: for a simulation, the device, cost model and GPU count it predicted."""
    if not engine.kind.simulated:
        # The layout that ran: the ranks and stages the model was split across (model/parallel/), recorded
        # where there were several (an executor that cannot split refused the run that asked it to).
        ranks = {key: getattr(engine, key) for key in ("tensor_parallel", "pipeline_parallel")
                 if getattr(engine, key) > 1}
        # vLLM's engine: another engine's numbers, its version and what its iterations cannot hold.
        foreign = {} if engine.kind.our_engine else {"vllm_version": vllm_version(), "iterations_note": UNAVAILABLE}
        return {"executor": engine.executor, "simulated": False, **foreign, **ranks}
    gpus = f"{engine.sim_tp * engine.sim_pp}x " if engine.sim_tp * engine.sim_pp > 1 else ""
    # Pipeline stages recorded where there are several (a record without the key had one).
    stages = {"sim_pp": engine.sim_pp} if engine.sim_pp > 1 else {}
    layout = f", {engine.sim_pp} pipeline stages" if stages else ""
    return {"executor": "sim", "simulated": True, "device": f"sim:{engine.sim_device}",
            "device_name": f"simulated {gpus}{engine.sim_device.upper()} ({engine.sim_cost_model} cost model{layout})",
            "sim_device": engine.sim_device, "sim_cost_model": engine.sim_cost_model, "sim_tp": engine.sim_tp,
            **stages}
