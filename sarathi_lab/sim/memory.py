"""Simulated device memory: KV-cache tokens that fit beside the weights, the share of memory a
serving engine gives its pools (config.GPU_MEMORY_UTILISATION, vLLM's) and the activations of the
largest iteration (the paper's B in tokens; docs/sim/README.md, section 8).
"""
from __future__ import annotations

from transformers import PretrainedConfig

from sarathi_lab.config import GPU_MEMORY_UTILISATION, ConfigError, check_count
from sarathi_lab.model.shape import Shape
from sarathi_lab.sim.device import Device


def _free_bytes(device: Device, config: PretrainedConfig, elem_bytes: int, utilisation: float) -> int:
    # NaN compares false both ways: without the check it became int(nan) deep below, or 0 bytes.
    if isinstance(utilisation, bool) or not isinstance(utilisation, (int, float)) or not 0 < utilisation <= 1:
        raise ConfigError(f"utilisation={utilisation!r} is invalid: must be a number in (0, 1]")
    usable = int(device.memory_bytes * utilisation)
    s = Shape.of(config)
    weights = s.weight_bytes(elem_bytes)
    if usable - weights < s.kv_bytes_per_token(elem_bytes):
        raise ConfigError(f"sim_device={device.name!r} is invalid for this model: {weights / 2**30:.1f} GiB of weights"
                          f" leave no room for a KV cache in {usable / 2**30:.1f} GiB")
    return usable - weights


def kv_capacity_tokens(device: Device, config: PretrainedConfig, elem_bytes: int = 2, max_tokens: int = 0,
                       utilisation: float = GPU_MEMORY_UTILISATION) -> int:
    """KV-cache tokens that fit on ``device`` beside the weights and the activations of an
    iteration of ``max_tokens`` tokens. Fails with one line when nothing fits."""
    check_count("max_tokens", max_tokens, 0)
    free = _free_bytes(device, config, elem_bytes, utilisation)
    s = Shape.of(config)
    free -= max_tokens * s.activation_bytes_per_token(elem_bytes)
    kv = s.kv_bytes_per_token(elem_bytes)
    if free < kv:
        raise ConfigError(f"max_tokens={max_tokens} is invalid on sim_device={device.name!r}: the activations of an"
                          " iteration this large leave no room for a KV cache")
    return free // kv


def max_batch(device: Device, config: PretrainedConfig, seq_len: int, elem_bytes: int = 2,
              utilisation: float = GPU_MEMORY_UTILISATION) -> int:
    """The paper's B: the most requests of ``seq_len`` tokens whose KV caches fit together with the
    activations of prefilling all of them in one iteration (the baseline's prefill batch)."""
    check_count("seq_len", seq_len, 1)
    s = Shape.of(config)
    per_request = seq_len * (s.kv_bytes_per_token(elem_bytes) + s.activation_bytes_per_token(elem_bytes))
    return _free_bytes(device, config, elem_bytes, utilisation) // per_request
