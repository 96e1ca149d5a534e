"""The KV planners over the scheduler config that plan_engine builds for them, for tests that call a
planner alone (plan_engine passes its own, built once)."""
from __future__ import annotations

from sarathi_lab.model.memory import context_limit, plan_kv_blocks
from sarathi_lab.plan import scheduler_config_of
from sarathi_lab.sim import simulated_kv_blocks


def sim_blocks(cfg, hf, context=None):
    """simulated_kv_blocks; ``context``: the longest request (default the model's limit)."""
    context = context_limit(cfg, hf) if context is None else context
    return simulated_kv_blocks(cfg, hf, scheduler_config_of(cfg, context), context)


def plan_blocks(cfg, hf, context, *args, **kwargs):
    """plan_kv_blocks, its other arguments as the planner takes them."""
    return plan_kv_blocks(cfg, hf, scheduler_config_of(cfg, context), context, *args, **kwargs)
