"""Every command of ``python -m sarathi_lab.measure NAME``, by name, in one table: each a
``module:callable`` imported only when it runs (a command may load torch), called with the
arguments after its name. ``python -m sarathi_lab.run`` (a run or sweep) and ``python -m
sarathi_lab.produce`` (the papers' experiments) are the package's other two commands."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Group:
    title: str
    commands: dict[str, str]  # name -> "module:callable"
    # Run as one call a signal ends, its tables unwritten (bench/case.py's runner writes at the end).
    interruptible: bool = False


GROUPS = (
    Group("benchmarks", {
        "ceilings": "sarathi_lab.measure.bench.ceilings:CASE.run",
        "iteration": "sarathi_lab.measure.bench.iteration:CASE.run",
        "overhead": "sarathi_lab.measure.bench.overhead:CASE.run",
        "host_path": "sarathi_lab.measure.bench.host_path:CASE.run",
        "plan_cost": "sarathi_lab.measure.bench.plan_cost:CASE.run",
        "versus": "sarathi_lab.measure.bench.versus:CASE.run",
        "attention_reread": "sarathi_lab.measure.bench.attention_reread:CASE.run",
        "sampling": "sarathi_lab.measure.bench.sampling:CASE.run",
        "tp_wire": "sarathi_lab.measure.bench.tp_wire:CASE.run",
    }, interruptible=True),
    Group("simulator checks", {
        "sim_validate": "sarathi_lab.measure.sim_check.sim_validate:main",
        "sim_speed": "sarathi_lab.measure.sim_check.sim_speed:main",
        "sim_process": "sarathi_lab.measure.sim_check.sim_process:main",
        "sim_pipeline": "sarathi_lab.measure.sim_check.sim_pipeline:main",
        "sim_fidelity": "sarathi_lab.measure.sim_check.sim_fidelity:main",
        "sim_vs_gpu": "sarathi_lab.measure.sim_check.sim_vs_gpu:main",
        "floor_claims": "sarathi_lab.measure.sim_check.floor_claims:main",
        "sim_chunk_align": "sarathi_lab.measure.sim_check.sim_chunk_align:main",
        "sim_chunk_pd": "sarathi_lab.measure.sim_check.sim_chunk_pd:main",
    }, interruptible=True),
    Group("simulator inputs and pages", {
        "calibration": "sarathi_lab.measure.sim_check.calibration_cli:main",
        "convert_gpu_kernels": "sarathi_lab.measure.sim_check.convert_gpu_kernels:main",
        "device_beside": "sarathi_lab.measure.bench.device_beside:main",
        "tile_alignment": "sarathi_lab.measure.bench.tile_alignment:main",
    }),
    Group("profiling", {
        "cpu_ceilings": "sarathi_lab.measure.profiling.cpu_ceilings:main",
        "floor_table": "sarathi_lab.measure.profiling.floor_table:main",
        "kernel_check": "sarathi_lab.measure.profiling.kernel_check:main",
        "link": "sarathi_lab.measure.profiling.link:main",
    }),
    Group("GPU suite", {
        "gpu": "sarathi_lab.measure.gpu.suite:main",
        "gpu_collect": "sarathi_lab.measure.gpu.collect:main",
        "gpu_predict": "sarathi_lab.measure.gpu.predict:main",
        "gpu_parts": "sarathi_lab.measure.gpu.parts:main",
        "gpu_wheels": "sarathi_lab.measure.gpu.wheels:main",
        "gpu_worker": "sarathi_lab.measure.gpu.worker:main",
    }),
    Group("analysis of result files", {
        "publish": "sarathi_lab.analysis.publish:main",
        "attribute": "sarathi_lab.analysis.attribute:main",
        "capacity_docs": "sarathi_lab.analysis.capacity_docs:main",
        "timeline": "sarathi_lab.analysis.timeline:main",
        "versus_vllm": "sarathi_lab.analysis.versus_vllm:main",
        "wandb_report": "sarathi_lab.analysis.wandb_report:main",
    }),
)
COMMANDS = {name: target for group in GROUPS for name, target in group.commands.items()}


def group_of(name: str) -> Group:
    return next(g for g in GROUPS if name in g.commands)


def module_file(name: str) -> Path:
    """The command's module file, found without importing it."""
    module = COMMANDS[name].partition(":")[0]
    return PACKAGE.joinpath(*module.split(".")[1:]).with_suffix(".py")


def load(name: str):
    """The command's callable, its module imported now."""
    module, _, attributes = COMMANDS[name].partition(":")
    found = importlib.import_module(module)
    for attribute in attributes.split("."):
        found = getattr(found, attribute)
    return found
