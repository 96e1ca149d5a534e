"""A sweep's first estimate where no earlier job on this machine tells: each job our engine runs on
this CPU, simulated on the CPU's measured ceilings (``engine.sim_device=cpu``). A floor, not a
forecast: the simulated kernels run at the ceilings and loading the model is not counted; once the
first job has ended, the rest are scaled by how its time compared (sweep_eta.SweepClock)."""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

from omegaconf import DictConfig

from sarathi_lab.config import ConfigError
from sarathi_lab.harness import sweep_eta
from sarathi_lab.harness.sweep_check import job_config
from sarathi_lab.host_features import resolve_device
from sarathi_lab.sim.device import MEASURE_COMMAND, cpu_device

log = logging.getLogger(__name__)

# The job as the simulator runs it, as a user would: the same overrides and these.
ON_THE_SIMULATOR = ("executor=sim", "engine.sim_device=cpu", "engine.sim_cost_model=roofline")


def simulated(config: DictConfig, overrides: list[list[str]], jobs: list[sweep_eta.Job],
              cfgs: list[Any], past: list[dict[str, Any]]
              ) -> tuple[list[sweep_eta.Job], str | None]:
    """``jobs`` with the simulator's seconds where no earlier job tells, and why none where it
    could not (None: nothing to say). ``cfgs``: each job's RunConfig, None where refused."""
    todo = [i for i, (job, cfg) in enumerate(zip(jobs, cfgs))
            if _ours_on_this_cpu(cfg) and sweep_eta.estimate(job, past).basis == "none"]
    if not todo:
        return jobs, None
    try:
        cpu_device(cfgs[todo[0]].dtype)
    except ConfigError:
        return jobs, ("the simulator's estimate needs this CPU's ceilings, not measured here: "
                      f"{MEASURE_COMMAND}")
    out = list(jobs)
    for i in todo:
        seconds = _serving_s(config, overrides[i])
        if seconds is not None:
            out[i] = dataclasses.replace(jobs[i], simulated_s=seconds)
    return out, None


def _ours_on_this_cpu(cfg: Any) -> bool:
    """A serving job on this CPU of a kind the simulator's CPU device times (our engine's)."""
    return (cfg is not None and cfg.task == "serve" and cfg.engine.kind.simulator_times("cpu")
            and resolve_device(cfg.device.name) == "cpu")


def _serving_s(config: DictConfig, overrides: list[str]) -> float | None:
    """The virtual seconds serving the job's workload takes on the simulator; None: refused."""
    from sarathi_lab import LLM, SamplingParams
    from sarathi_lab.harness.preflight import preflight

    try:
        cfg = job_config(config, [*overrides, *ON_THE_SIMULATOR])
        checked = preflight(cfg)
        llm = LLM.from_plan(checked.plan)
        w = checked.workload
        llm.generate(w.prompts, max_new_tokens=w.decode_lens, arrival_times=w.arrival_times,
                     sampling=SamplingParams(ignore_eos=True), max_concurrency=w.max_concurrency)
        return float(llm.metrics.summary(cfg.slo.as_slo())["makespan_s"])
    except Exception as e:  # noqa: BLE001 - an estimate never stops a sweep
        log.debug("no simulated estimate of %s: %s: %s", overrides, type(e).__name__, e)
        return None
