"""Every check that can refuse a run, done by arithmetic before any result is deleted and before any
model, table or prompt is allocated: the model's config, the context, the token budget, and memory.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sarathi_lab.config import ConfigError, EngineConfig
from sarathi_lab.harness.budget import auto_budget
from sarathi_lab.harness.schema import RunConfig, engine_key
from sarathi_lab.harness.tasks import check_task, kv_blocks, kv_requests
from sarathi_lab.harness.vllm_args import check_vllm
from sarathi_lab.harness.workloads import Workload, build_workload
from sarathi_lab.plan import EnginePlan, ModelLimits, build_scheduler, plan_engine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Checked:
    """What a run that passed the preflight runs: its requests, its engine's plan (token_budget=auto
    resolved), and what metrics.json records of an auto budget."""
    workload: Workload
    plan: EnginePlan
    budget: dict[str, Any]


def preflight(cfg: RunConfig) -> Checked:
    """The run's requests and engine, once everything the run needs is known to fit; else a one-line
    ConfigError (or ModelLoadError) naming the key as the run's config spells it."""
    try:
        limits = ModelLimits.of(cfg.engine)
    except ConfigError as e:  # a model directory that cannot be loaded (ModelLoadError) too
        raise e.at(cfg.key_of(e.key), rename=engine_key) from None
    workload = build_workload(cfg.workload, cfg.seq_len, cfg.pd_ratio, cfg.seed, limits.config.vocab_size,
                              limits.max_model_len)
    if cfg.task == "capacity" and workload.arrival_times and workload.recorded_rate_rps is None \
            and cfg.workload.kind == "trace" and workload.num_requests > 1:
        raise ConfigError(f"workload.path={cfg.workload.path!r} is invalid with task=capacity: its "
                          f"{workload.num_requests} replayed rows all arrive at once, so the search has no rate "
                          "to scale")
    # Before the KV cache, which a simulated device sizes around the largest iteration the budget sets.
    engine, budget = _token_budget(cfg, workload)
    try:
        plan = plan_engine(engine, limits)
    except ConfigError as e:
        raise _as_set(e, cfg, budget) from None
    if engine.executor == "vllm":
        check_vllm(plan, cfg.task)
    blocks, key = plan.num_kv_blocks, engine.kv_size_key or "num_kv_blocks"
    setting = f"engine.{key}={getattr(engine, key)}"
    sized = " (its default size; engine.num_kv_blocks sets it)" if engine.kv_size_key is None else ""
    try:
        scheduler = build_scheduler(plan)
    except ConfigError as e:
        if e.key != "num_kv_blocks":
            raise _as_set(e, cfg, budget) from None
        raise ConfigError(f"{setting} is invalid{str(e).partition(' is invalid')[2]}{sized}") from None
    if scheduler.refusal(workload.max_request_len) is not None:
        kept = scheduler.blocks.watermark_blocks
        beside = (f" beside the {kept} block{'s' * (kept != 1)} engine.kv_watermark={engine.kv_watermark} keeps free"
                  if kept else "")
        raise ConfigError(f"{setting} is invalid: the KV cache holds {plan.kv_capacity_tokens} tokens, fewer than "
                          f"one request of {workload.max_request_len}{beside}{sized}")
    if cfg.task != "serve":
        check_task(cfg.task, cfg, limits.max_model_len)
    held = kv_requests(cfg.task, cfg) if cfg.task != "serve" else []
    need = kv_blocks(held, engine.block_size)
    if need > blocks:
        raise ConfigError(f"{setting} is invalid with task={cfg.task}: the KV cache holds {blocks} blocks, fewer than "
                          f"the {need} its batch of {len(held)} requests takes{sized}")
    return Checked(workload, plan, budget)


def _token_budget(cfg: RunConfig, workload: Workload) -> tuple[EngineConfig, dict[str, Any]]:
    if cfg.token_budget != "auto" or cfg.scheduler.name != "sarathi_serve":
        return cfg.engine, {}
    engine, budget = auto_budget(cfg.engine, cfg.slo.tbt_p99_s, workload.max_request_len)
    log.info("token_budget=auto: %d tokens (the %s cost model predicts %.4g s for its fullest iteration, "
             "within slo.tbt_p99_s=%g)%s", budget.tokens, budget.cost_model, budget.predicted_s, cfg.slo.tbt_p99_s,
             "; capped: the SLO does not bind" if budget.capped else "")
    return engine, {"token_budget": budget.tokens, "token_budget_predicted_s": budget.predicted_s}


def _as_set(e: ConfigError, cfg: RunConfig, budget: dict[str, Any]) -> ConfigError:
    """e naming the key as the run's config sets it (a tuned budget by token_budget=auto and its SLO)."""
    if e.key in cfg.scheduler.knobs:
        return e.at(f"scheduler.{e.key}", rename=engine_key)
    if not budget or e.key != "token_budget":
        return e.at(cfg.key_of(e.key), rename=engine_key)
    tokens, why = budget["token_budget"], str(e.at(e.key, rename=engine_key))
    return ConfigError(f"token_budget=auto ({tokens} tokens for slo.tbt_p99_s={cfg.slo.tbt_p99_s})"
                       f"{why.removeprefix(f'token_budget={tokens}')}; a lower slo.tbt_p99_s, or "
                       "token_budget=null and a chunk that fits, leaves room")
