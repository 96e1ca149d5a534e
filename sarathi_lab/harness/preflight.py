"""Every check that can refuse a run, by arithmetic before anything is deleted or allocated."""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from sarathi_lab.config import ConfigError, EngineConfig, Keys, named_as
from sarathi_lab.harness.budget import auto_budget
from sarathi_lab.harness.schema import RunConfig
from sarathi_lab.harness.tasks import check_task, kv_blocks, kv_requests
from sarathi_lab.harness.workloads import Workload, build_workload
from sarathi_lab.plan import (
    EnginePlan,
    ModelLimits,
    build_scheduler,
    kv_size_note,
    kv_size_setting,
    plan_engine,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Checked:
    workload: Workload
    plan: EnginePlan
    budget: dict[str, Any]


def preflight(cfg: RunConfig) -> Checked:
    """The run's edge: refusals name keys as the run's config spells them."""
    keys = cfg.keys
    with named_as(keys):
        limits = ModelLimits.of(cfg.engine)
        workload = build_workload(cfg.workload, cfg.seq_len, cfg.pd_ratio, cfg.seed,
                                  limits.config.vocab_size, limits.max_model_len)
        if cfg.task == "capacity" and workload.arrival_times \
                and workload.recorded_rate_rps is None \
                and cfg.workload.kind == "trace" and workload.num_requests > 1:
            raise ConfigError(f"workload.path={cfg.workload.path!r} is invalid with task=capacity: "
                              f"its {workload.num_requests} replayed rows all arrive at once, so "
                              "the search has no rate to scale")
        # Before the KV cache: a simulated device sizes it around the budget's largest iteration.
        engine, budget, keys = _token_budget(cfg, workload, keys)
    with named_as(keys):
        return _fitted(cfg, workload, limits, engine, budget)


def _fitted(cfg: RunConfig, workload: Workload, limits: ModelLimits, engine: EngineConfig,
            budget: dict[str, Any]) -> Checked:
    try:
        plan = plan_engine(engine, limits)
    except ConfigError as e:
        if not budget or e.setting != "chunk_size":
            raise
        # The SLO set the budget that does not fit.
        raise ConfigError(f"{e.template}; a lower slo.tbt_p99_s, or token_budget=null and a chunk "
                          "that fits, leaves room", e.setting) from None
    engine.kind.check_plan(plan)
    blocks, setting, sized = plan.num_kv_blocks, kv_size_setting(engine), kv_size_note(engine)
    scheduler = build_scheduler(plan)
    if scheduler.refusal(workload.max_request_len) is not None:
        kept = scheduler.blocks.watermark_blocks
        beside = (f" beside the {kept} block{'s' * (kept != 1)} "
                  f"engine.kv_watermark={engine.kv_watermark} keeps free" if kept else "")
        raise ConfigError(f"{setting} is invalid: the KV cache holds {plan.kv_capacity_tokens} "
                          f"tokens, fewer than one request of {workload.max_request_len}"
                          f"{beside}{sized}")
    if cfg.task != "serve":
        check_task(cfg.task, cfg, limits.max_model_len)
    held = kv_requests(cfg.task, cfg, plan) if cfg.task != "serve" else []
    if (need := kv_blocks(held, engine.block_size)) > blocks:
        raise ConfigError(f"{setting} is invalid with task={cfg.task}: the KV cache holds {blocks} "
                          f"blocks, fewer than the {need} its batch of {len(held)} requests "
                          f"takes{sized}")
    return Checked(workload, plan, budget)


def _token_budget(cfg: RunConfig, workload: Workload,
                  keys: Keys) -> tuple[EngineConfig, dict[str, Any], Keys]:
    """token_budget=auto: sarathi_serve's budget tuned to the SLO, its record, keys naming it."""
    if cfg.token_budget != "auto" or cfg.scheduler.name != "sarathi_serve":
        return cfg.engine, {}, keys
    engine, budget = auto_budget(cfg.engine, cfg.slo.tbt_p99_s, workload.max_request_len)
    log.info("token_budget=auto: %d tokens (the %s cost model predicts %.4g s for its fullest "
             "iteration, within slo.tbt_p99_s=%g)%s", budget.tokens, budget.cost_model,
             budget.predicted_s, cfg.slo.tbt_p99_s,
             "; capped: the SLO does not bind" if budget.capped else "")
    stages = cfg.engine.kind.stages(cfg.engine)
    if stages > 1:
        # The SLO bounds a micro-batch's passage, not how evenly those in flight share the work: one
        # may take a burst of prompts while the next holds decodes.
        log.warning("token_budget=auto under %d pipeline stages: the largest budget within the "
                    "SLO is not always the one that holds the most; sweep token_budget=null "
                    "chunk=... to find it (docs/parallel.md)", stages)
    # The budget is the SLO's now: a refusal of it names token_budget=auto, as the user set it.
    tuned = f"auto ({budget.tokens} tokens for slo.tbt_p99_s={cfg.slo.tbt_p99_s})"
    keys = replace(keys, names={**keys.names, "chunk_size": "token_budget"},
                   shown={**keys.shown, "chunk_size": tuned})

    record = {"token_budget": budget.tokens, "token_budget_predicted_s": budget.predicted_s}
    return engine, record, keys

