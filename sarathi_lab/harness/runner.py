"""One experiment run: check everything cheap, build the engine, serve the workload through it (or
run a measurement task on it), save the results, log to W&B.

Independent of Hydra's runtime (run.py supplies the RunContext), so tests can call it directly.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sarathi_lab import LLM, ConfigError, EngineConfig, Metrics, SamplingParams
from sarathi_lab.harness.environment import collect_environment
from sarathi_lab.harness.progress import Progress
from sarathi_lab.harness.results import (
    RunResult,
    Status,
    clear_results,
    config_change,
    is_finished,
    write_results,
    write_status,
)
from sarathi_lab.harness.schema import RunConfig
from sarathi_lab.harness.tasks import measurement
from sarathi_lab.harness.wandb_logger import WandbRun, log_to_wandb
from sarathi_lab.harness.workloads import Workload, build_workload
from sarathi_lab.model import load_config

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunContext:
    output_dir: Path
    overrides: list[str]    # what this run changed from the defaults (Hydra's task overrides)
    run_name: str
    group: str | None       # the sweep this run belongs to


def prepare_workload(cfg: RunConfig) -> Workload:
    """The run's requests, after every check that needs no weights; raises a one-line ConfigError."""
    engine = EngineConfig(**cfg.engine_kwargs())
    model_config = load_config(engine.model)
    workload = build_workload(cfg.workload, cfg.seq_len, cfg.pd_ratio, cfg.seed, model_config.vocab_size)
    context = engine.max_model_len or model_config.max_position_embeddings
    if workload.max_request_len > context:
        key, value = ("workload.path", cfg.workload.path) if cfg.workload.kind == "trace" else ("seq_len", cfg.seq_len)
        raise ConfigError(f"{key}={value!r} is invalid: it gives requests of {workload.max_request_len} tokens, "
                          f"more than the context of model={cfg.model.engine_model} ({context} tokens)")
    return workload


def run_experiment(cfg: RunConfig, resolved_config: dict[str, Any], ctx: RunContext) -> Status:
    out = ctx.output_dir
    if is_finished(out) and _keep_finished_run(cfg, resolved_config, out):
        return "skipped"
    workload = prepare_workload(cfg)
    clear_results(out)
    write_status(out, "running")

    llm = LLM(**cfg.engine_kwargs())
    _check_kv_capacity(llm, workload, cfg)
    start = time.perf_counter()

    def save(summary: dict[str, float], tables: dict[str, pd.DataFrame], partial: bool) -> None:
        write_results(out, tables, RunResult(
            summary=summary, config=cfg.key_values(), overrides=ctx.overrides, resolved_config=resolved_config,
            environment=collect_environment(llm.config.torch_device, llm.dtype), partial=partial,
            wall_time_s=time.perf_counter() - start))

    if cfg.task == "serve":
        try:
            _serve(llm, workload)
        except KeyboardInterrupt:
            # Metrics are appended live, so what was measured before the signal is whole, just incomplete.
            save(llm.metrics.summary(), _engine_tables(llm.metrics), partial=True)
            log.warning("interrupted: partial records saved in %s as *.partial.*", out)
            raise
        summary, tables = llm.metrics.summary(), _engine_tables(llm.metrics)
        history = llm.metrics.iteration_rows()
        log.info("results in %s: %s", out, _headline(summary))
    else:
        summary, tables = measurement(cfg.task)(cfg, llm)
        history = []
        log.info("results in %s: %s", out, ", ".join(f"{k}.parquet" for k in tables))
    save(summary, tables, partial=False)

    log_to_wandb(cfg.logger, WandbRun(
        run_dir=out, name=ctx.run_name, group=ctx.group, job_type=cfg.name,
        tags=list(dict.fromkeys([*cfg.tags, cfg.name, cfg.task, cfg.scheduler.name, cfg.model.name])),
        config=resolved_config, summary=summary, history=history,
        # Iterations are already the history.
        tables={k: v for k, v in tables.items() if k != "iterations"}))
    return "ok"


def _keep_finished_run(cfg: RunConfig, resolved_config: dict[str, Any], out: Path) -> bool:
    """Whether to keep the finished run in out (skip); False: overwrite it; refusals raise."""
    if cfg.on_existing == "refuse":
        raise ConfigError(f"on_existing=refuse: {out} already holds a finished run; on_existing=skip keeps it, "
                          "on_existing=overwrite replaces it")
    if cfg.on_existing == "skip":
        # Job dirs are numbered, so a different sweep into the same dir would skip the wrong runs.
        change = config_change(out, resolved_config)
        if change:
            raise ConfigError(f"on_existing=skip: {out} holds a finished run of another config ({change}); "
                              "use another hydra.sweep.dir, or on_existing=overwrite")
        log.info("%s already holds this finished run; skipped (on_existing=skip)", out)
    return cfg.on_existing == "skip"


def _serve(llm: LLM, workload: Workload) -> None:
    progress = Progress(workload.total_tokens - workload.num_requests, workload.num_requests, lambda: llm.metrics)
    try:
        llm.generate(workload.prompts, max_new_tokens=workload.decode_lens, arrival_times=workload.arrival_times,
                     sampling=SamplingParams(ignore_eos=True), on_iteration=progress)
    finally:
        progress.close()


def _engine_tables(metrics: Metrics) -> dict[str, pd.DataFrame]:
    return {"iterations": pd.DataFrame(metrics.iteration_rows()), "requests": pd.DataFrame(metrics.request_rows())}


def _check_kv_capacity(llm: LLM, workload: Workload, cfg: RunConfig) -> None:
    capacity = llm.kv_capacity_tokens
    if workload.max_request_len > capacity:
        raise ConfigError(f"engine.kv_cache_gb={cfg.engine.kv_cache_gb} / engine.num_kv_blocks="
                          f"{cfg.engine.num_kv_blocks} is invalid: the KV cache holds {capacity} tokens, "
                          f"fewer than one request of {workload.max_request_len}")
    if cfg.batch_size * workload.max_request_len > capacity:
        log.warning("the KV cache (%d tokens) cannot hold batch_size=%d requests of %d tokens: expect preemptions",
                    capacity, cfg.batch_size, workload.max_request_len)


def _headline(summary: dict[str, float]) -> str:
    return (f"{summary['total_throughput']:,.0f} tok/s total, {summary['decode_throughput']:,.1f} decode tok/s, "
            f"TTFT p50 {summary['ttft_p50']:.3f}s, TBT p99 {summary['tbt_p99']:.4f}s, "
            f"{summary['num_iterations']} iterations in {summary['makespan_s']:.1f}s")
