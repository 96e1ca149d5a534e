"""One experiment run; a rerun works in `.<dir>.next/`, swapped in once finished, else discarded."""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf
from sarathi_kernels import cpu_build

from sarathi_lab import LLM, ConfigError, SamplingParams
from sarathi_lab.config import AS_WRITTEN, Written, named_as
from sarathi_lab.env_flags import EnvFlagError, env_flag
from sarathi_lab.executors import build
from sarathi_lab.harness.interrupts import raise_if_interrupted
from sarathi_lab.harness.preflight import Checked, preflight
from sarathi_lab.harness.progress import Progress
from sarathi_lab.harness.results import (
    Status,
    UnreadableRun,
    clear_results,
    config_change,
    is_finished,
    lock,
    next_dir,
    override_key,
    write_status,
)
from sarathi_lab.harness.run_recorder import RunRecorder, engine_tables, wandb_name
from sarathi_lab.harness.schema import RunConfig, WorkloadCfg
from sarathi_lab.harness.tasks import TaskContext, measurement, takes_context
from sarathi_lab.harness.wandb_logger import WandbSession
from sarathi_lab.harness.workloads import Workload, resolve_trace_path
from sarathi_lab.model import ModelLoadError

if TYPE_CHECKING:
    import pyarrow as pa

    from sarathi_lab.harness.vllm_engine import VllmLLM
    from sarathi_lab.model.shared_engine import SharedEngine
    from sarathi_lab.plan import EnginePlan

log = logging.getLogger(__name__)
TRACE_KINDS = ("trace", "trace_lengths")
SHARE_ENGINE_ENV = "SARATHI_SHARE_ENGINE"


@dataclass
class RunContext:
    output_dir: Path
    overrides: list[str]
    group: str | None
    # Written to .hydra/ once the run is accepted.
    hydra_record: dict[str, Any] | None = None
    status_dir: Path | None = None  # output_dir, or beside it where a finished run is there
    lock: int | None = None
    sweep_job: bool = False         # keeps its config's finished run under on_existing=refuse too

    def release(self) -> None:
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None


def run_experiment(cfg: RunConfig, resolved_config: dict[str, Any], ctx: RunContext) -> Status:
    """The edge where the engine's refusals are named as the run's config spells them."""
    with named_as(cfg.keys):
        return _run_experiment(cfg, resolved_config, ctx)


def _run_experiment(cfg: RunConfig, resolved_config: dict[str, Any], ctx: RunContext) -> Status:
    out = ctx.output_dir
    finished = claim_status_dir(ctx) != out
    inputs = run_inputs(cfg)
    if finished and _keep_finished_run(cfg, resolved_config, out, ctx.sweep_job, inputs):
        return "skipped"
    checked = preflight(cfg)
    _open_run_dir(ctx, finished, checked.plan)
    group = ctx.group or (f"{cfg.name}-{out.name}" if cfg.task == "capacity" else cfg.name)
    # A rerun beside a finished run opens W&B once swapped in, where its W&B run will live.
    wandb = None if finished else WandbSession(cfg.logger, wandb_name(
        cfg, out, run_name(cfg, ctx.overrides), group, resolved_config))
    try:
        return _run_and_log(cfg, resolved_config, ctx, checked, inputs, group, wandb)
    except BaseException:
        if wandb is not None:
            wandb.abandon()
        raise


def _run_and_log(cfg: RunConfig, resolved_config: dict[str, Any], ctx: RunContext,
                 checked: Checked, inputs: dict[str, Any], group: str,
                 wandb: WandbSession | None) -> Status:
    out = ctx.output_dir
    finished = ctx.status_dir != out
    llm = _build_llm(cfg, checked)
    raise_if_interrupted()  # torch's import can swallow a signal's exception; ended here, not later
    recorder = RunRecorder(
        cfg, llm, resolved_config, ctx.overrides, inputs,
        # What the plan settled beyond the config (an auto budget, the KV cache's size).
        plan_record=checked.budget | {"kv_capacity_tokens": checked.plan.kv_capacity_tokens},
        group=group, run_dir=ctx.status_dir, wandb=wandb)
    if cfg.task == "serve":
        summary, tables, headline = _serve_and_summarize(cfg, llm, checked.workload, recorder)
    else:
        task = measurement(cfg.task)
        context = TaskContext(ctx.status_dir, checked.workload, recorder.record_run,
                              recorder.save_partial, resolved_config)
        summary, tables = task(cfg, llm, context) if takes_context(cfg.task) else task(cfg, llm)
        headline = ", ".join(f"{k}.parquet" for k in tables)
    environment = recorder.save(ctx.status_dir, summary, tables, partial=False)
    if not isinstance(llm, LLM):
        # vLLM's engine, after the run's load was judged: its shutdown's threads stay out of it.
        llm.close()
    if finished:
        _swap_in(ctx)
    # A prediction must not read as a measurement: a simulated run says so first.
    where = f"{environment['device_name']}, " if environment["simulated"] else ""
    log.info("results in %s: %s%s", out, where, headline)
    recorder.log(out, run_name(cfg, ctx.overrides), summary, tables, environment)
    return "ok"


def _open_run_dir(ctx: RunContext, finished: bool, plan: EnginePlan) -> None:
    """Clears an earlier attempt's leavings, writes Hydra's record, marks the run running."""
    if finished:
        shutil.rmtree(ctx.status_dir, ignore_errors=True)
        ctx.status_dir.mkdir(parents=True)
    else:
        clear_results(ctx.output_dir)
    if ctx.hydra_record:
        (ctx.status_dir / ".hydra").mkdir(exist_ok=True)
        for name, node in ctx.hydra_record.items():
            OmegaConf.save(node, ctx.status_dir / ".hydra" / name)
    # Before `running`: a library killing the process as it loads leaves no live-looking run.
    plan.config.kind.prepare(plan)
    write_status(ctx.status_dir, "running")


def load_kernels(plan: EnginePlan) -> None:
    """Our model's library of CPU kernels (the model kind's step before `running`): a GPU run plans
    its attention work on the host; a CPU run computes on it."""
    on_cpu = plan.host.device_type == "cpu"
    cpu_build.library(cpu_build.KERNELS if on_cpu else cpu_build.PLANNER)


def _build_llm(cfg: RunConfig, checked: Checked) -> LLM | VllmLLM:
    llm = build(checked.plan, cfg.engine.kind.shared_parts(cfg))
    if isinstance(llm, LLM):  # our scheduler's reserves; vLLM's engine says what it records
        _warn_on_kv_limits(llm, checked.workload, cfg)
    return llm


def shared_engine(cfg: RunConfig) -> SharedEngine | None:
    """The process's engine parts, which a sweep's jobs of our model share (the model kind's
    ``shared_parts``; SARATHI_SHARE_ENGINE=false: each job builds its own); an engine of ours that
    cannot take them (parallel ranks) frees them, since its plan counted their memory as free."""
    from sarathi_lab.model.shared_engine import SHARED

    try:
        share = env_flag(SHARE_ENGINE_ENV, default=True)
    except EnvFlagError as e:
        raise ConfigError(None, why=str(e)) from None
    if share and cfg.engine.world_size == 1:
        return SHARED
    SHARED.release()
    return None


def release_shared(cfg: RunConfig) -> None:
    """Frees the process's engine parts for an engine that takes none of them (vLLM's)."""
    from sarathi_lab.model.shared_engine import SHARED

    SHARED.release()


def _serve_and_summarize(cfg: RunConfig, llm: LLM | VllmLLM, workload: Workload,
                         recorder: RunRecorder
                         ) -> tuple[dict[str, float], dict[str, pa.Table], str]:
    slo = cfg.slo.as_slo()
    try:
        _serve(llm, workload)
    except KeyboardInterrupt:
        # Metrics are appended live: what was measured before a signal is whole, just incomplete.
        recorder.save_partial(llm.metrics.summary(slo), engine_tables(llm.metrics))
        raise
    summary, tables = llm.metrics.summary(slo), engine_tables(llm.metrics)
    if summary["saturated"]:
        # A first setting that drains, from what this run sustained.
        span = summary["makespan_s"]
        served = len(workload.prompts) / span if span > 0 else 0.0
        log.warning("the waiting queue grew by %.0f requests over the arrivals and never drained: "
                    "the latency percentiles describe how long this run was, not a steady state. "
                    "It served %.3g req/s at batch_size=%d; a first setting that drains: "
                    "workload.qps=%.2g (below that), or a larger batch_size; task=capacity "
                    "searches the highest rate within the SLOs",
                    summary["queue_growth_requests"], served, cfg.batch_size, 0.5 * served)
    headline = (f"{summary['total_throughput_tok_s']:,.0f} tok/s total, "
                f"{summary['decode_throughput_tok_s']:,.1f} decode tok/s, "
                f"TTFT p50 {summary['ttft_p50_s']:.3f}s, ITL p99 {summary['itl_p99_s']:.4f}s, "
                f"{summary['num_iterations']} iterations in {summary['makespan_s']:.1f}s")
    return summary, tables, headline


def _swap_in(ctx: RunContext) -> None:
    out, run_dir = ctx.output_dir, ctx.status_dir
    old = out.parent / f".{out.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    os.rename(out, old)
    os.rename(run_dir, out)
    _move_log_file(run_dir, out)
    shutil.rmtree(old)
    ctx.status_dir = out


# Left out of a run's name: what its key values already say, and what does not change the run.
_UNNAMED = {"model", "scheduler", "chunk", "batch_size", "experiment", "logger", "logger.mode",
            "on_existing", "export.timeline"}


def run_name(cfg: RunConfig, overrides: list[str]) -> str:
    """'tiny sarathi chunk=64 batch_size=4 workload.qps=2'."""
    other = [o for o in overrides if override_key(o) not in _UNNAMED and not o.startswith("hydra")]
    return " ".join([cfg.model.name, cfg.scheduler.name, f"chunk={cfg.chunk}",
                     f"batch_size={cfg.batch_size}", *other])


def record_failure(status_dir: Path, e: BaseException) -> None:
    if isinstance(e, KeyboardInterrupt):
        write_status(status_dir, "interrupted", error=f"interrupted by {e}")
    elif isinstance(e, (ConfigError, ModelLoadError)):
        write_status(status_dir, "failed", error=str(e))
    else:
        write_status(status_dir, "failed", error=f"{type(e).__name__}: {e}",
                     traceback=traceback.format_exc())


def claim_status_dir(ctx: RunContext) -> Path:
    """Where status and log go: beside the output dir if it holds a finished run."""
    if ctx.status_dir is None:
        if ctx.output_dir.is_symlink():
            # The rerun and swap go beside the run where the link points: rmtree refuses a link.
            ctx.output_dir = ctx.output_dir.resolve()
        ctx.lock = _lock(ctx.output_dir)
        finished = is_finished(ctx.output_dir)
        ctx.status_dir = next_dir(ctx.output_dir) if finished else ctx.output_dir
        if finished:
            _move_log_file(ctx.output_dir, ctx.status_dir)
    return ctx.status_dir


def _lock(out: Path) -> int | None:
    """Two runs started in the same second share a ${now:...} name; None: no locks here."""
    out.mkdir(parents=True, exist_ok=True)
    try:
        return lock(out)
    except BlockingIOError:
        raise ConfigError(None, why=f"{out} is in use: another run is writing there now; give "
                          "this run its own hydra.run.dir (hydra.sweep.dir with -m)") from None


def _move_log_file(src: Path, dst: Path) -> None:
    """Hydra's log file was opened on the job's first line."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) \
                and Path(handler.baseFilename).parent.resolve() == src.resolve():
            handler.acquire()
            try:
                if handler.stream is not None:
                    handler.stream.close()
                    handler.stream = None
                dst.mkdir(parents=True, exist_ok=True)
                name = Path(handler.baseFilename).name
                handler.baseFilename = os.path.join(os.path.abspath(dst), name)
            finally:
                handler.release()


def _keep_finished_run(cfg: RunConfig, resolved_config: dict[str, Any], out: Path,
                       sweep_job: bool = False, inputs: dict[str, Any] | None = None) -> bool:
    """True: keep (skip), False: overwrite; a sweep's job keeps its own run under ``refuse`` too."""
    if cfg.on_existing == "refuse" and not sweep_job:
        raise ConfigError("on_existing", Written("refuse"), f": {out} already holds a finished "
                          "run; on_existing=skip keeps it, on_existing=overwrite replaces it",
                          keys=AS_WRITTEN)
    if cfg.on_existing == "overwrite":
        return False
    # Job dirs are numbered, so a different sweep into the same dir would skip the wrong runs.
    try:
        change = config_change(out, resolved_config, inputs)
    except UnreadableRun as e:
        raise ConfigError("on_existing", Written(cfg.on_existing), f": {e}, so whether it is "
                          "this config's run is unknown; on_existing=overwrite replaces it",
                          keys=AS_WRITTEN) from None
    if change:
        raise ConfigError("on_existing", Written(cfg.on_existing), f": {out} holds a finished "
                          f"run of another config ({change}); use another hydra.sweep.dir, or "
                          "on_existing=overwrite", keys=AS_WRITTEN)
    log.info("%s already holds this finished run; kept (on_existing=%s%s)", out, cfg.on_existing,
             ": the sweep resumes" if cfg.on_existing == "refuse" else "")
    return True


def _serve(llm: LLM | VllmLLM, workload: Workload) -> None:
    n = workload.num_requests
    progress = Progress(workload.total_tokens - n, n, lambda: llm.metrics)
    try:
        llm.generate(workload.prompts, max_new_tokens=workload.decode_lens,
                     arrival_times=workload.arrival_times,
                     sampling=SamplingParams(ignore_eos=True), on_iteration=progress,
                     max_concurrency=workload.max_concurrency)
    finally:
        progress.close()


def _warn_on_kv_limits(llm: LLM, workload: Workload, cfg: RunConfig) -> None:
    capacity = llm.kv_capacity_tokens
    n = workload.num_requests
    at_once = min(cfg.batch_size, n, workload.max_concurrency or n)
    if reserved := llm.engine.scheduler.reserved_blocks(llm.max_model_len, llm.config.block_size):
        fits = llm.block_manager.admissible_blocks // reserved
        if fits < at_once:
            log.warning("scheduler=%s reserves max_model_len=%d tokens for each request: "
                        "the KV cache (%d tokens) holds %d at once, fewer than the %d the run "
                        "could batch",
                        cfg.scheduler.name, llm.max_model_len, capacity, fits, at_once)
    elif at_once * workload.max_request_len > capacity:
        log.warning("the KV cache (%d tokens) cannot hold %d requests of %d tokens: "
                    "expect preemptions", capacity, at_once, workload.max_request_len)


def run_inputs(cfg: RunConfig) -> dict[str, Any]:
    """A relative model.path names another checkpoint from another directory: resolved."""
    found = trace_inputs(cfg.workload)
    if cfg.model.name == "hf" and cfg.model.path:
        found["model.path_resolved"] = str(Path(cfg.model.path).expanduser().resolve())
    return found


def trace_inputs(workload: WorkloadCfg) -> dict[str, Any]:
    """{} for an unreadable trace too: the run's own checks refuse it, naming why."""
    if workload.kind not in TRACE_KINDS or not workload.path:
        return {}
    try:
        path = resolve_trace_path(workload.path).resolve()
        with path.open("rb") as f:
            digest = hashlib.file_digest(f, "sha256")
    except (ConfigError, OSError):
        return {}
    return {"workload.path_resolved": str(path), "workload.sha256": digest.hexdigest()}
