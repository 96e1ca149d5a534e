"""Where a run ran, recorded beside its numbers so that runs from different machines compare."""
from __future__ import annotations

import platform
import sys
from importlib import metadata
from typing import TYPE_CHECKING, Any

from sarathi_lab import code_commit
from sarathi_lab.config import EngineConfig
from sarathi_lab.harness.vllm_args import UNAVAILABLE, vllm_version
from sarathi_lab.sim.device import cpu_name

if TYPE_CHECKING:
    import torch

    from sarathi_lab.sim.device import SimulatedDtype


def device_name(device: torch.device | str = "cpu") -> str:
    """The name a run's and a measurement's records give the device."""
    import torch

    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


def collect_environment(engine: EngineConfig, device: torch.device | str | None,
                        dtype: torch.dtype | SimulatedDtype, cpu_gemm: str | None,
                        load: dict[str, Any],
                        cuda_graphs: dict[str, Any] | None = None) -> dict[str, Any]:
    commit, commit_source = code_commit.source_commit()
    changes = (code_commit._git("status", "--porcelain", "--untracked-files=no")
               if commit_source == "git" else None)
    version = code_commit._installed()[0]
    torch = sys.modules.get("torch")  # a simulated run loads none: no threads of it ran
    return {
        # Where it ran: the device measured, or the simulated one and the host that ran it.
        **engine.kind.record(engine, device),
        # The dtype that ran, which the engine may have changed (bf16 on a CPU without bf16 units).
        "dtype": str(dtype).removeprefix("torch."),
        "cpu_gemm": cpu_gemm,
        # None: every forward eager.
        "cuda_graphs": cuda_graphs,
        "torch": torch.__version__ if torch else metadata.version("torch"),
        "python": platform.python_version(),
        "host": platform.node(),
        "torch_threads": torch.get_num_threads() if torch else None,
        **load,
        "sarathi_lab_version": version,
        "git_commit": commit,
        "git_commit_source": commit_source,
        "git_dirty": None if changes is None else bool(changes),
    }


EAGER, GRAPHS, MIXED_GRAPHS = "eager", "decode CUDA graphs", "decode and mixed CUDA graphs"


def graphs_kind(cuda_graphs: Any) -> str:
    """Nothing, decode-only forwards (an older record: a list of sizes), or mixed batches too."""
    if not cuda_graphs:
        return EAGER
    mixed = isinstance(cuda_graphs, dict) and cuda_graphs.get("mixed_tokens")
    return MIXED_GRAPHS if mixed else GRAPHS


def engine_kind(environments: list[dict]) -> str | None:
    kinds = {graphs_kind(env.get("cuda_graphs")) for env in environments}
    if not kinds:
        return None
    return " and ".join(sorted(kinds)) + (" (runs differ)" if len(kinds) > 1 else "")


def measured_record(engine: EngineConfig, device: torch.device | str,
                    **foreign: Any) -> dict[str, Any]:
    """Our model's executor: the device it ran on, with the ranks and stages the model was split
    across, recorded where there were several."""
    ranks = {key: getattr(engine, key) for key in ("tensor_parallel", "pipeline_parallel")
             if getattr(engine, key) > 1}
    return {"executor": engine.executor, "simulated": False, **foreign, **ranks,
            "device": str(device), "device_name": device_name(device)}


def vllm_record(engine: EngineConfig, device: torch.device | str) -> dict[str, Any]:
    """vLLM's engine: another engine's numbers, its version and what its iterations lack."""
    return measured_record(engine, device, vllm_version=vllm_version(), iterations_note=UNAVAILABLE)


def simulated_record(engine: EngineConfig, device: torch.device | str | None) -> dict[str, Any]:
    """The simulated device, and the host that ran the simulation (on its CPU, whatever device the
    engine's config names)."""
    gpus = f"{engine.sim_tp * engine.sim_pp}x " if engine.sim_tp * engine.sim_pp > 1 else ""
    # Pipeline stages recorded where there are several (a record without the key had one).
    stages = {"sim_pp": engine.sim_pp} if engine.sim_pp > 1 else {}
    layout = f", {engine.sim_pp} pipeline stages" if stages else ""
    name = (f"simulated {gpus}{engine.sim_device.upper()} "
            f"({engine.sim_cost_model} cost model{layout})")
    return {"executor": "sim", "simulated": True, "device": f"sim:{engine.sim_device}",
            "device_name": name, "sim_device": engine.sim_device,
            "sim_cost_model": engine.sim_cost_model, "sim_tp": engine.sim_tp, **stages,
            "host_device": "cpu"}
