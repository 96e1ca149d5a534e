"""Every check that can refuse a run, done before any result is deleted and before any model, table
or prompt is allocated: the model's config and weight headers, the context, and the memory the
model, its RoPE table, its KV cache and the prompts would take, by arithmetic against the machine's.
"""
from __future__ import annotations

import torch

from sarathi_lab.config import ConfigError, device_memory_bytes
from sarathi_lab.harness.schema import RunConfig
from sarathi_lab.harness.workloads import Workload, build_workload
from sarathi_lab.model import load_config
from sarathi_lab.model.memory import context_limit, kv_block_bytes, rope_table_bytes, weight_bytes


def preflight(cfg: RunConfig) -> Workload:
    """The run's requests, once everything the run needs is known to fit; else a one-line ConfigError
    (or ModelLoadError) naming the key."""
    engine = cfg.engine
    hf = load_config(engine.model)
    limit = context_limit(hf)
    if engine.max_model_len is not None and engine.max_model_len > limit:
        raise ConfigError(f"engine.max_model_len={engine.max_model_len} is invalid: model={engine.model} allows at "
                          f"most {limit}")
    context = engine.max_model_len or limit
    if engine.warmup_iters >= context:
        raise ConfigError(f"engine.warmup_iters={engine.warmup_iters} is invalid: a warm-up request of 1 prompt "
                          f"token and {engine.warmup_iters} decodes exceeds the context of {context} tokens")
    capacity = _check_memory(cfg, hf, context) if engine.executor == "model" else None
    workload = build_workload(cfg.workload, cfg.seq_len, cfg.pd_ratio, cfg.seed, hf.vocab_size, context)
    if capacity is not None and workload.max_request_len > capacity:
        key = "engine.num_kv_blocks" if engine.num_kv_blocks is not None else "engine.kv_cache_gb"
        raise ConfigError(f"{key}={getattr(engine, key.removeprefix('engine.'))} is invalid: the KV cache holds "
                          f"{capacity} tokens, fewer than one request of {workload.max_request_len}")
    return workload


def _check_memory(cfg: RunConfig, hf, context: int) -> int | None:
    """The KV capacity in tokens where the config fixes it (None: the engine sizes it), after checking
    that the model, its RoPE table and that cache fit the device's memory."""
    engine = cfg.engine
    elem = torch.empty((), dtype=engine.torch_dtype).element_size()
    block = kv_block_bytes(hf, engine.block_size, elem)
    blocks = engine.num_kv_blocks
    if blocks is None and engine.kv_cache_gb is not None:
        blocks = int(engine.kv_cache_gb * 2**30 // block)
        if blocks < 1:
            raise ConfigError(f"engine.kv_cache_gb={engine.kv_cache_gb} is invalid: it holds no KV block of "
                              f"{block} bytes")
    device = engine.device_type
    have = device_memory_bytes(device)
    parts = {"the weights": weight_bytes(hf, elem, device == "cpu" and engine.cpu_linear == "onednn"),
             "the RoPE table": rope_table_bytes(hf, context), "the KV cache": (blocks or 0) * block}
    if sum(parts.values()) > have:
        largest = max(parts, key=parts.get)
        rope_key = (f"engine.max_model_len={engine.max_model_len}" if engine.max_model_len is not None
                    else f"model={engine.model!r} (max_position_embeddings={context}; engine.max_model_len caps it)")
        key = {"the weights": f"model={engine.model!r}", "the RoPE table": rope_key,
               "the KV cache": (f"engine.num_kv_blocks={blocks}" if engine.num_kv_blocks is not None
                                else f"engine.kv_cache_gb={engine.kv_cache_gb}")}[largest]
        sizes = ", ".join(f"{name} {size / 2**30:.1f} GiB" for name, size in parts.items())
        raise ConfigError(f"{key} is invalid: the run needs {sum(parts.values()) / 2**30:.1f} GiB ({sizes}), more "
                          f"than this {device}'s {have / 2**30:.1f} GiB")
    return None if blocks is None else blocks * engine.block_size
