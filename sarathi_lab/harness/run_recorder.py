"""What a run writes and logs, one object, so the run, its partials and a task's runs agree."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sarathi_lab import Metrics
from sarathi_lab import host_load as load
from sarathi_lab.harness.engine_tables import engine_tables
from sarathi_lab.harness.environment import collect_environment
from sarathi_lab.harness.results import RunResult, write_results
from sarathi_lab.harness.schema import RunConfig
from sarathi_lab.harness.wandb_logger import WandbRun, log_to_wandb

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    Tables = dict[str, pd.DataFrame | pa.Table]  # a measurement's DataFrames, or the engine's

log = logging.getLogger(__name__)


@dataclass
class RunRecorder:
    cfg: RunConfig
    llm: Any
    resolved_config: dict[str, Any]
    overrides: list[str]
    inputs: dict[str, Any]
    plan_record: dict[str, Any]  # what the plan settled that the config does not say
    group: str
    run_dir: Path
    # The machine's load when the run began, which assess() compares the end against.
    before: Any = field(default_factory=load.snapshot)
    start: float = field(default_factory=time.perf_counter)

    def save(self, directory: Path, summary: dict[str, float], tables: Tables, partial: bool,
             config: dict[str, Any] | None = None) -> dict[str, Any]:
        directory.mkdir(parents=True, exist_ok=True)
        llm = self.llm
        # A simulation runs on the host's CPU, whatever device the engine's config names.
        device = "cpu" if llm.config.kind.simulated else llm.device
        environment = collect_environment(llm.config, device, llm.dtype, llm.cpu_gemm,
                                          self._machine(), llm.cuda_graphs)
        write_results(directory, tables, RunResult(
            summary=summary | self.plan_record,
            config=self.cfg.key_values() | self._settled() | (config or {}),
            overrides=self.overrides, resolved_config=self.resolved_config, environment=environment,
            partial=partial, wall_time_s=time.perf_counter() - self.start, inputs=self.inputs))
        return environment

    def _settled(self) -> dict[str, Any]:
        """The chunk alignment that ran (auto settled), which results tables are indexed by."""
        return {"chunk_align": self.llm.plan.scheduler_config.chunk_alignment}

    def log(self, directory: Path, name: str, summary: dict[str, float], tables: Tables,
            environment: dict[str, Any]) -> None:
        cfg = self.cfg
        log_to_wandb(cfg.logger, WandbRun(
            run_dir=directory, name=name, group=self.group, job_type=cfg.name,
            tags=list(dict.fromkeys([*cfg.tags, cfg.name, cfg.task, cfg.scheduler.name,
                                     cfg.model.name,
                                     *(["simulated"] if environment["simulated"] else [])])),
            config=self.resolved_config, environment=environment,
            summary=summary | self.plan_record,
            history=tables.get("iterations"),
            tables={k: v for k, v in tables.items() if k != "iterations"}))

    def record_run(self, directory: Path, name: str, summary: dict[str, float], metrics: Metrics,
                   config: dict[str, Any], partial: bool = False) -> None:
        tables = engine_tables(metrics)
        environment = self.save(directory, summary, tables, partial=partial, config=config)
        if not partial:  # W&B gets finished runs only
            self.log(directory, name, summary, tables, environment)

    def save_partial(self, summary: dict[str, float], tables: Tables) -> None:
        self.save(self.run_dir, summary, tables, partial=True)
        log.warning("interrupted: partial records saved in %s as *.partial.*", self.run_dir)

    def _machine(self) -> dict[str, Any]:
        machine = load.assess(self.before, load.snapshot())
        if self.cfg.engine.kind.simulated:
            # Virtual-clock times do not depend on the machine's load.
            machine |= {"timing_unreliable": False, "timing_note": None}
        if machine["timing_note"]:
            log.warning("%s", machine["timing_note"])
        if self.cfg.engine.kind.runs_model:
            from sarathi_lab.attention.backend import interpreted

            if why := interpreted(self.llm.config.attention, self.llm.device):
                # Whatever the load: the times are the interpreter's, not the engine's.

                machine |= {"timing_unreliable": True, "timing_note": why}
        return machine

