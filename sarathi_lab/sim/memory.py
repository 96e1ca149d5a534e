"""Simulated device memory: how many tokens of KV cache fit beside the weights.

    capacity_tokens = floor((M_device * utilisation - M_weights - activation_reserve) / kv_bytes_per_token)

the paper's B = floor((M_gpu - M_weights) / (L * m_kv)) in tokens instead of requests, with the
share of memory a serving engine gives its pools (vLLM's and this engine's 0.9) and the
activations of the largest iteration kept back. For LLaMA-13B on an A6000 at 1K the bare formula
gives 30 requests; keeping 0.9 and the activations of the baseline's B x 1K-token prefill gives
the paper's 18 (``max_batch``).
"""
from __future__ import annotations

from transformers import PretrainedConfig

from sarathi_lab.config import ConfigError, check_count
from sarathi_lab.profiling.floors import Shape
from sarathi_lab.sim.device import Device

# The engine's own share on CUDA (llm.py's _CUDA_MEMORY_UTILISATION) and vLLM's default.
MEMORY_UTILISATION = 0.9


def weight_bytes(config: PretrainedConfig, elem_bytes: int) -> int:
    s = Shape.of(config)
    per_layer = s.layer_linear_params + 2 * s.hidden  # two RMSNorm weights
    embeddings = s.vocab * s.hidden * (1 if config.tie_word_embeddings else 2)
    return (s.layers * per_layer + embeddings + s.hidden) * elem_bytes


def kv_bytes_per_token(config: PretrainedConfig, elem_bytes: int) -> int:
    s = Shape.of(config)
    return s.kv_elems_per_token_layer * s.layers * elem_bytes


def activation_bytes_per_token(config: PretrainedConfig, elem_bytes: int) -> int:
    """Peak live activations per token of one forward: the residual stream, the fused qkv output,
    the gated MLP's two halves and their product, and float32 logits (an upper bound: the engine
    computes logits only for the rows it samples)."""
    s = Shape.of(config)
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return (2 * s.hidden + q + 2 * kv + 3 * s.intermediate) * elem_bytes + 4 * s.vocab


def _free_bytes(device: Device, config: PretrainedConfig, elem_bytes: int, utilisation: float) -> int:
    # NaN compares false both ways: without the check it became int(nan) deep below, or 0 bytes.
    if isinstance(utilisation, bool) or not isinstance(utilisation, (int, float)) or not 0 < utilisation <= 1:
        raise ConfigError(f"utilisation={utilisation!r} is invalid: must be a number in (0, 1]")
    usable = int(device.memory_bytes * utilisation)
    weights = weight_bytes(config, elem_bytes)
    if usable - weights < kv_bytes_per_token(config, elem_bytes):
        raise ConfigError(f"sim_device={device.name!r} is invalid for this model: {weights / 2**30:.1f} GiB of weights"
                          f" leave no room for a KV cache in {usable / 2**30:.1f} GiB")
    return usable - weights


def kv_capacity_tokens(device: Device, config: PretrainedConfig, elem_bytes: int = 2, max_tokens: int = 0,
                       utilisation: float = MEMORY_UTILISATION) -> int:
    """KV-cache tokens that fit on ``device`` beside the weights and the activations of an
    iteration of ``max_tokens`` tokens. Fails with one line when nothing fits."""
    check_count("max_tokens", max_tokens, 0)
    free = _free_bytes(device, config, elem_bytes, utilisation)
    free -= max_tokens * activation_bytes_per_token(config, elem_bytes)
    kv = kv_bytes_per_token(config, elem_bytes)
    if free < kv:
        raise ConfigError(f"max_tokens={max_tokens} is invalid on sim_device={device.name!r}: the activations of an"
                          " iteration this large leave no room for a KV cache")
    return free // kv


def max_batch(device: Device, config: PretrainedConfig, seq_len: int, elem_bytes: int = 2,
              utilisation: float = MEMORY_UTILISATION) -> int:
    """The paper's B: the most requests of ``seq_len`` tokens whose KV caches fit together with the
    activations of prefilling all of them in one iteration (the baseline's prefill batch)."""
    check_count("seq_len", seq_len, 1)
    per_request = seq_len * (kv_bytes_per_token(config, elem_bytes) + activation_bytes_per_token(config, elem_bytes))
    return _free_bytes(device, config, elem_bytes, utilisation) // per_request
