"""Every check that can refuse a run, done before any result is deleted and before any model, table
or prompt is allocated: the model's config and weight headers, the context, and the memory the
model, its RoPE table, its KV cache (model/memory.py) and the prompts would take, by arithmetic
against the machine's.
"""
from __future__ import annotations

from sarathi_lab.config import ConfigError
from sarathi_lab.engine.clock import VirtualClock
from sarathi_lab.harness.schema import RunConfig, engine_key
from sarathi_lab.harness.tasks import kv_blocks, kv_requests
from sarathi_lab.harness.workloads import Workload, build_workload
from sarathi_lab.model import load_config
from sarathi_lab.model.memory import context_limit, plan_kv_blocks
from sarathi_lab.sim import build_simulation


def preflight(cfg: RunConfig) -> Workload:
    """The run's requests, once everything the run needs is known to fit; else a one-line ConfigError
    (or ModelLoadError) naming the key as the run's config spells it."""
    engine = cfg.engine
    hf = load_config(engine.model)
    try:
        context = context_limit(engine, hf)
        if engine.executor == "model":
            blocks = plan_kv_blocks(engine, hf, context, engine.torch_dtype, engine.torch_device)
        else:
            # The simulated device, its cost model and KV cache, as LLM builds them (no weights: cheap);
            # the LLM warns of a what-if KV cache when it builds them for the run, once per job.
            try:
                _, blocks = build_simulation(engine, hf, VirtualClock(), warn=False)
            except FileNotFoundError as e:  # a profile not measured yet
                raise ConfigError(f"sim_cost_model={engine.sim_cost_model!r} is invalid here: {e}") from None
    except ConfigError as e:
        raise e.at(engine_key(e.key)) from None
    workload = build_workload(cfg.workload, cfg.seq_len, cfg.pd_ratio, cfg.seed, hf.vocab_size, context)
    if engine.num_kv_blocks is None and engine.kv_cache_gb is None:
        return workload
    key = "num_kv_blocks" if engine.num_kv_blocks is not None else "kv_cache_gb"
    if workload.max_request_len > blocks * engine.block_size:
        raise ConfigError(f"engine.{key}={getattr(engine, key)} is invalid: the KV cache holds "
                          f"{blocks * engine.block_size} tokens, fewer than one request of {workload.max_request_len}")
    held = kv_requests(cfg.task, cfg) if cfg.task != "serve" else []
    need = kv_blocks(held, engine.block_size)
    if need > blocks:
        raise ConfigError(f"engine.{key}={getattr(engine, key)} is invalid with task={cfg.task}: the KV cache holds "
                          f"{blocks} blocks, fewer than the {need} its batch of {len(held)} requests takes")
    return workload
