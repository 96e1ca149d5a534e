"""The interface every attention backend implements, and the one place that picks one by name."""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from sarathi_lab.attention.metadata import AttentionMetadata
from sarathi_lab.config import ATTENTIONS, attention_backend, check_attention_hybrid

# The paged KV cache of one layer: [num_blocks, block_size, num_kv_heads, head_dim] for keys and
# the same for values. Block-major keeps a request's block contiguous, the layout vLLM uses.


class AttentionBackend(ABC):
    """Backends hold no per-iteration state: what every layer of an iteration shares is built once,
    by ``plan``, onto the metadata all layers see."""

    name: str

    def plan(self, meta: AttentionMetadata, k_cache: torch.Tensor) -> None:
        """Called once per iteration before the forward, with one layer's key cache; may set ``meta.plan``."""

    @abstractmethod
    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, meta: AttentionMetadata) -> None:
        """Store this step's keys/values ([T, kv_heads, head_dim]) at ``meta.slot_mapping``."""

    @abstractmethod
    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """Causal attention of ``query`` ([T, heads, head_dim]) over each request's cached context, which
        holds this step's keys already (``write_kv`` ran); returns [T, heads, head_dim]."""


def make_backend(name: str, device: torch.device, hybrid: str = "sequential") -> AttentionBackend:
    """``auto`` takes the Triton kernels on CUDA and the PyTorch path elsewhere; ``hybrid``
    (EngineConfig.attention_hybrid) is the Triton kernels' way with hybrid batches."""
    name = attention_backend(name, device.type)
    check_attention_hybrid(hybrid, name)
    if name == "triton":
        from sarathi_lab.attention.triton_backend import TritonAttention

        return TritonAttention(hybrid)
    if name == "torch":
        from sarathi_lab.attention.torch_backend import TorchAttention

        return TorchAttention()
    raise ValueError(f"attention={name!r} is not a backend; allowed: {', '.join(ATTENTIONS)}")
