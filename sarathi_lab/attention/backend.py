"""The interface every attention backend implements, and the one place that picks one by name."""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from sarathi_lab.attention.metadata import AttentionMetadata
from sarathi_lab.config import ATTENTIONS

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

    def rope_write_kv(self, rotary, positions: torch.Tensor, qkv: torch.Tensor, num_heads: int, num_kv_heads: int,
                      k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """The queries of ``qkv`` ([T, (heads + 2 * kv_heads) * head_dim], the fused projection's output)
        rotated by ``rotary`` (the model's RotaryEmbedding) at ``positions``, after its rotated keys and
        its values were stored (``write_kv``); returns the queries [T, heads, head_dim]. Two steps here;
        a backend may fuse them."""
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
        """Causal attention of ``query`` ([T, heads, head_dim]) over each request's cached context, which
        holds this step's keys already (``write_kv`` ran); returns [T, heads, head_dim]."""


def make_backend(name: str, device: torch.device) -> AttentionBackend:
    """``auto`` takes the Triton kernels on CUDA and the PyTorch path elsewhere."""
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "triton":
        from sarathi_lab.attention.triton_backend import TritonAttention

        return TritonAttention()
    if name == "torch":
        from sarathi_lab.attention.torch_backend import TorchAttention

        return TorchAttention()
    raise ValueError(f"attention={name!r} is not a backend; allowed: {', '.join(ATTENTIONS)}")
