"""The interface every attention backend implements, and the one place that picks one by name."""
from __future__ import annotations

import functools
import logging
from abc import ABC, abstractmethod

import torch

from sarathi_lab.attention.metadata import AttentionMetadata
from sarathi_lab.config import ATTENTIONS

log = logging.getLogger("sarathi_lab")

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


def resolved(name: str, device: torch.device) -> str:
    """The backend ``name`` runs on ``device``: ``auto`` takes the Triton kernels on CUDA, PyTorch elsewhere."""
    if name == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return name


def interpreted(name: str, device: torch.device) -> str | None:
    """Why attention ``name`` on ``device`` times no kernel of its own (Triton's interpreter runs it in
    Python, tens of times slower than the compiled kernel and than attention=torch), or None. The one
    home of that answer: the engine warns by it, and the harness flags the run's timings by it."""
    if resolved(name, device) != "triton" or device.type == "cuda":
        return None
    return (f"attention=triton on {device.type} runs Triton's interpreter (no GPU to compile for): correct, "
            "but tens of times slower than attention=torch, so its times measure the interpreter")


@functools.cache
def _warn_interpreted(why: str) -> None:
    log.warning("%s; runs are flagged timing_unreliable", why)


def make_backend(name: str, device: torch.device) -> AttentionBackend:
    """``auto`` takes the Triton kernels on CUDA and the PyTorch path elsewhere."""
    name = resolved(name, device)
    if (why := interpreted(name, device)) is not None:
        _warn_interpreted(why)
    if name == "triton":
        from sarathi_lab.attention.triton_backend import TritonAttention

        return TritonAttention()
    if name == "torch":
        from sarathi_lab.attention.torch_backend import TorchAttention

        return TorchAttention()
    raise ValueError(f"attention={name!r} is not a backend; allowed: {', '.join(ATTENTIONS)}")
