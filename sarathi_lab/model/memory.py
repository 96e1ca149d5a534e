"""Memory from shapes before any allocation: a config that can't fit fails in one line first."""
from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any

from sarathi_lab import host_memory
from sarathi_lab.config import GPU_MEMORY_UTILISATION, ConfigError, EngineConfig, Key, Words
from sarathi_lab.engine.block_manager import blocks_beside_watermark, blocks_for
from sarathi_lab.engine.scheduler import SchedulerConfig, scheduler_class
from sarathi_lab.model.shape import Shape
from sarathi_lab.model.shared_engine import SHARED

# torch only where a real device is asked: the simulator plans too.
if TYPE_CHECKING:
    import torch

    from sarathi_lab.model.spec import ModelConfig

# Without an explicit budget the CPU cache may take at most this share of the machine's memory.
CPU_KV_MEMORY_SHARE = 0.25


def context_limit(cfg: EngineConfig, hf: ModelConfig) -> int:
    limit = hf.max_position_embeddings
    # Sliding-window attention is not implemented, so the context stops at the window.
    if getattr(hf, "sliding_window", None) and getattr(hf, "use_sliding_window", True):
        limit = min(limit, hf.sliding_window)
    if cfg.max_model_len is not None:
        if cfg.max_model_len > limit:
            raise ConfigError("max_model_len", cfg.max_model_len,
                              f"is invalid: the model allows at most {limit}")
        limit = cfg.max_model_len
    if cfg.warmup_iters >= limit:
        if cfg.max_model_len is not None and cfg.warmup_iters == EngineConfig.warmup_iters:
            # The context the user set is what is too short, not the warm-up they left as it was.
            raise ConfigError("max_model_len", cfg.max_model_len,
                              f"is invalid: the engine's warm-up generates {cfg.warmup_iters} "
                              "tokens after a one-token prompt, so it must be at least "
                              f"{cfg.warmup_iters + 1}",
                              f">= {cfg.warmup_iters + 1}, or " + Key("warmup_iters") + "=0")
        raise ConfigError("warmup_iters", cfg.warmup_iters,
                          f"is invalid: must be < the context of {limit} tokens")
    return limit


def device_memory_bytes(device: torch.device) -> int:
    """Free, as a fresh process would find it: what the shared engine holds counts as free (it
    frees it before building anything else)."""
    if device.type == "cuda":
        if (before := SHARED.free_before(device)) is not None:
            return before
        import torch

        # Freed memory stays reserved by torch's allocator, which mem_get_info counts as taken.
        gc.collect()
        torch.cuda.empty_cache()
        return torch.cuda.mem_get_info(device)[0]
    return host_memory.available().bytes + SHARED.held_bytes(device)


def where_memory(device: torch.device) -> str:
    if device.type == "cuda":
        return str(device)
    bound = host_memory.available().bound_by
    return str(device) if bound.startswith("the machine") else f"{device} under {bound}"


def packed_copies(cfg: EngineConfig, dtype: torch.dtype, device_type: str) -> int:
    if device_type != "cpu" or cfg.cpu_linear == "aten":
        return 0
    from sarathi_kernels import cpu_ops

    # By equality, not hash: a simulated CPU's plan holds a SimulatedDtype equal to torch's.
    return 2 if any(dtype == d for d in cpu_ops.DTYPES) else 1


def resident_weight_bytes(cfg: EngineConfig, shape: Shape, context: int, dtype: torch.dtype,
                          device_type: str) -> int:
    copies = 1 + packed_copies(cfg, dtype, device_type)
    return shape.weight_bytes(dtype.itemsize) * copies + rotary_bytes(shape, context)


def rotary_bytes(shape: Shape, context: int) -> int:
    return 4 * context * shape.head_dim * 4


def context_refused(cfg: EngineConfig, shape: Shape, context: int, why: str) -> ConfigError | None:
    """Names max_model_len where the context's tables take most of the memory, not the weights."""
    tables = rotary_bytes(shape, context)
    if tables <= shape.weight_bytes(1):
        return None
    said = f"{_gib(tables)} GiB of rotary tables, {why}"
    allowed = Key("max_model_len") + "=N, a shorter context"
    # The model's own config claims the context: it is the model at fault.
    if cfg.max_model_len is None:
        return ConfigError("model", cfg.model, "is invalid here: its config's context of "
                           f"{context} positions (max_position_embeddings) needs {said}", allowed)
    return ConfigError("max_model_len", cfg.max_model_len,
                       f"is invalid: a context of {context} positions needs {said}", allowed)


def block_refused(cfg: EngineConfig, block_bytes: int, room: int,
                  where: Words) -> ConfigError | None:
    """Names block_size where one block outgrows the room (one token: the memory is short)."""
    if block_bytes <= room or cfg.block_size == 1:
        return None
    fits = max(room // (block_bytes // cfg.block_size), 1)
    return ConfigError("block_size", cfg.block_size,
                       f"is invalid: one block of KV cache takes {_gib(block_bytes)} GiB, more "
                       f"than the {_gib(max(room, 0))} GiB left on " + where
                       + " beside the weights",
                       f"a block of at most {fits} tokens (16 is usual)")


def weights_refused(cfg: EngineConfig, shape: Shape, context: int, dtype: torch.dtype,
                    device_type: str, why: str, room_bytes: int) -> tuple[str, Words]:
    """(why, allowed)."""
    total = resident_weight_bytes(cfg, shape, context, dtype, device_type)
    copies = packed_copies(cfg, dtype, device_type)
    packed = copies * shape.weight_bytes(dtype.itemsize)
    said = f"its weights take {_gib(total - packed)} GiB in {str(dtype).removeprefix('torch.')}"
    if copies:
        said += (f" and the CPU GEMM's {copies} packed cop{'ies' if copies > 1 else 'y'} of them "
                 f"{_gib(packed)} GiB more ({_gib(total)} GiB in all)")
    way_out: Words = "a smaller model or dtype"
    if copies and total - packed <= room_bytes:
        way_out = (Key("cpu_linear") + f"=aten, which packs no copy ({_gib(total - packed)} GiB "
                   f"in all; its decode batches run slower: docs/cpu_engine.md), or {way_out}")
    return f"{said}, {why}", way_out


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f}"


def gpu_kv_bytes(shape: Shape, elem_bytes: int, memory_bytes: int, weight_bytes: int,
                 max_tokens: int, utilisation: float = GPU_MEMORY_UTILISATION) -> int:
    """vLLM's rule."""
    return (int(memory_bytes * utilisation) - weight_bytes
            - max_tokens * shape.activation_bytes_per_token(elem_bytes))


def tokens_with_activations(shape: Shape, elem_bytes: int, free_bytes: int) -> int:
    """Every token an iteration runs is cached (the SARATHI paper's B is this / seq_len)."""
    return max(free_bytes, 0) // (shape.kv_bytes_per_token(elem_bytes)
                                  + shape.activation_bytes_per_token(elem_bytes))


def whole_prompt_kv_blocks(cfg: EngineConfig, shape: Shape, context: int, elem_bytes: int,
                           free_bytes: int, largest: int | None) -> int:
    """A whole-prompt iteration holds no more tokens than the cache: both are sized together."""
    bound = (cfg.max_batch_size * context if largest is None
             else min(cfg.max_batch_size * context, largest))
    block_bytes = shape.kv_bytes_per_token(elem_bytes) * cfg.block_size
    blocks = (free_bytes - bound * shape.activation_bytes_per_token(elem_bytes)) // block_bytes
    if blocks * cfg.block_size < bound:
        # The cache binds first: the largest iteration runs every token it holds.
        blocks = tokens_with_activations(shape, elem_bytes, free_bytes) // cfg.block_size
    return max(blocks, 0)


def default_kv_blocks(cfg: EngineConfig, sched: SchedulerConfig, shape: Shape, context: int,
                      dtype: torch.dtype, device_type: str, memory_bytes: int, weight_bytes: int,
                      where: Words, too_large: tuple[str, Any, Words] | None = None) -> int:
    """``too_large``: (setting, value, why) refused where the model leaves no room (the model)."""
    setting, value, invalid = too_large or ("model", cfg.model, "is invalid on " + where)
    elem_bytes = dtype.itemsize
    block_bytes = shape.kv_bytes_per_token(elem_bytes) * cfg.block_size
    room = (gpu_kv_bytes(shape, elem_bytes, memory_bytes, weight_bytes, 0) if device_type == "cuda"
            else memory_bytes - weight_bytes)
    if room < block_bytes:
        why = f"which leaves no room for a KV cache in {_gib(memory_bytes)} GiB"
        if room > 0 and (refused := block_refused(cfg, block_bytes, room, where)) is not None:
            raise refused  # the weights fit: one block is what does not
        if (refused := context_refused(cfg, shape, context, why)) is not None:
            raise refused
        said, allowed = weights_refused(cfg, shape, context, dtype, device_type, why,
                                        memory_bytes - block_bytes)
        raise ConfigError(setting, value, invalid + ": " + said, allowed)
    if device_type == "cuda":
        scheduler = scheduler_class(cfg.scheduler)
        tokens = scheduler.largest_iteration_tokens(sched)
        if scheduler.prefills_whole_prompts or tokens is None:
            blocks = whole_prompt_kv_blocks(cfg, shape, context, elem_bytes, room, tokens)
            if blocks < 1:
                raise ConfigError(setting, value, invalid + ": beside its weights no block of KV "
                                  "cache fits with the activations of prefilling its tokens whole ("
                                  + Key("scheduler") + f"={cfg.scheduler})")
            return blocks
        room = gpu_kv_bytes(shape, elem_bytes, memory_bytes, weight_bytes, tokens)
        if room < block_bytes:
            raise ConfigError("chunk_size", cfg.chunk_size,
                              "is invalid on " + where + ": an iteration of this many tokens and a "
                              f"decode per running request ({tokens} in all) leaves no room for a "
                              "KV cache")
        return room // block_bytes
    # Each micro-batch in flight holds its blocks until its tokens return, else stages idle.
    requests = cfg.max_batch_size * cfg.pipeline_parallel
    wanted = blocks_beside_watermark(requests * blocks_for(context, cfg.block_size),
                                     cfg.kv_watermark)
    return min(wanted, int(memory_bytes * CPU_KV_MEMORY_SHARE // block_bytes), room // block_bytes)


def plan_kv_blocks(cfg: EngineConfig, hf: ModelConfig, sched: SchedulerConfig, context: int,
                   dtype: torch.dtype, device: torch.device, available: int | None = None) -> int:
    shape, elem = Shape.of(hf), dtype.itemsize
    block_bytes = shape.kv_bytes_per_token(elem) * cfg.block_size
    weights = resident_weight_bytes(cfg, shape, context, dtype, device.type)
    available = device_memory_bytes(device) if available is None else available
    room = available - weights
    if room <= 0:
        why = f"more than the {_gib(available)} GiB available on {where_memory(device)}"
        if (refused := context_refused(cfg, shape, context, why)) is not None:
            raise refused
        said, allowed = weights_refused(cfg, shape, context, dtype, device.type, why,
                                        available - block_bytes)
        raise ConfigError("model", cfg.model, "is invalid here: " + said, allowed)
    key, blocks = cfg.kv_size_key, cfg.explicit_kv_blocks(block_bytes)
    if (key is None or blocks * block_bytes > room) and (
            refused := block_refused(cfg, block_bytes, room, where_memory(device))):
        raise refused
    if key is not None:
        if blocks * block_bytes > room:
            raise ConfigError(key, getattr(cfg, key), "is invalid: "
                              + kv_excess(blocks, block_bytes, room, where_memory(device)))
        return blocks
    return default_kv_blocks(cfg, sched, shape, context, dtype, device.type, available, weights,
                             str(device))


def kv_excess(blocks: int, block_bytes: int, room: int, where: Words) -> Words:
    return (f"{blocks} blocks of {block_bytes} bytes take {_gib(blocks * block_bytes)} GiB, "
            f"more than the {_gib(max(room, 0))} GiB left on " + where + " beside the weights")
