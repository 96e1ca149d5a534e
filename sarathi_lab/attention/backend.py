"""The attention backend interface, capabilities as class attributes, and its name registry."""
from __future__ import annotations

import functools
import logging
from abc import ABC, abstractmethod

import torch

from sarathi_lab.attention.metadata import AttentionMetadata
from sarathi_lab.config import ATTENTIONS, check_attention_hybrid

log = logging.getLogger("sarathi_lab")

# The paged KV cache of one layer: [num_blocks, block_size, num_kv_heads, head_dim], keys and values
# alike; block-major keeps a request's block contiguous, as vLLM lays it out.


class AttentionBackend(ABC):
    """Backends hold no per-iteration state: what the layers share is built once by ``plan``."""

    # Its registry name: the attention= value that picks it.
    name: str
    # Its forward reads every per-batch value from device tensors, so a CUDA graph can replay it.
    replayable: bool = False
    # Device types it runs on (torch.device.type), and those on which attention=auto picks it.
    devices: tuple[str, ...] = ("cpu", "cuda")
    preferred_on: tuple[str, ...] = ()

    def plan(self, meta: AttentionMetadata, k_cache: torch.Tensor) -> None:
        """Called once per iteration before the forward, with one layer's key cache; may set ``meta.plan``."""

    def warm(self, query_lens: list[int], seq_lens: list[int], num_prefills: int, num_heads: int,
             k_cache: torch.Tensor) -> None:
        """Plan a likely next batch of these lengths while the device runs this one."""

    @abstractmethod
    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, meta: AttentionMetadata) -> None:
        """Store this step's keys/values ([T, kv_heads, head_dim]) at ``meta.slot_mapping``."""

    def rope_write_kv(self, rotary, positions: torch.Tensor, qkv: torch.Tensor, num_heads: int, num_kv_heads: int,
                      k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """``qkv``'s queries rotated at ``positions``, after its rotated keys and values were stored
        (``write_kv``); a backend may fuse the two steps."""
        t, head_dim = qkv.shape[0], k_cache.shape[-1]
        # q and k rotate together: one pass over both, same angles per token.
        qk = rotary(positions, qkv[:, : (num_heads + num_kv_heads) * head_dim].view(t, -1, head_dim))
        q, k = qk.split([num_heads, num_kv_heads], dim=1)
        v = qkv[:, (num_heads + num_kv_heads) * head_dim:].view(t, num_kv_heads, head_dim)
        self.write_kv(k, v, k_cache, v_cache, meta)
        return q

    @abstractmethod
    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """Causal attention over each request's cached context (this step's keys included)."""


_REGISTRY: dict[str, type[AttentionBackend]] = {}
# attention=auto on a device type no backend prefers: the one that runs anywhere.
FALLBACK = "torch"


def register_backend(name: str):
    def wrap(cls: type[AttentionBackend]) -> type[AttentionBackend]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return wrap


def backend_names() -> tuple[str, ...]:
    """Every registered backend's name (the package imports each module that registers one)."""
    return tuple(_REGISTRY)


def backend_class(name: str, device: torch.device) -> type[AttentionBackend]:
    """``auto``: the backend that prefers the device's type (Triton on CUDA), else FALLBACK."""
    if name == "auto":
        name = next((n for n, cls in _REGISTRY.items() if device.type in cls.preferred_on), FALLBACK)
    if name not in _REGISTRY:
        raise ValueError(f"attention={name!r} is not a backend; allowed: {', '.join(ATTENTIONS)}")
    return _REGISTRY[name]


def interpreted(name: str, device: torch.device) -> str | None:
    """Why ``name`` on ``device`` times no kernel of its own (Triton's interpreter, tens of times
    slower), or None: the one answer the engine warns by and the harness flags timings by."""
    cls = backend_class(name, device)
    if device.type in cls.devices:
        return None
    return (f"attention={cls.name} on {device.type} runs Triton's interpreter (no GPU to compile for): correct, "
            "but tens of times slower than attention=torch, so its times measure the interpreter")


@functools.cache
def _warn_interpreted(why: str) -> None:
    log.warning("%s; runs are flagged timing_unreliable", why)


def make_backend(name: str, device: torch.device, hybrid: str = "sequential") -> AttentionBackend:
    """``hybrid`` (EngineConfig.attention_hybrid): Triton's way; other backends: ``sequential``."""
    cls = backend_class(name, device)
    check_attention_hybrid(hybrid, cls.name)
    if (why := interpreted(name, device)) is not None:
        _warn_interpreted(why)
    return cls(hybrid) if hybrid != "sequential" else cls()
