"""A LLaMA decoder's blocks over [T, hidden], elementwise work fused, rounding as the fallback."""
from __future__ import annotations

import functools
import importlib

import torch
from sarathi_kernels import cpu_ops
from torch import nn
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from sarathi_lab.tuned_kernels import TunedTable, table_for


def fused_ops(x: torch.Tensor):
    if cpu_ops.supports(x):
        return cpu_ops
    return (_triton_module("pointwise")
            if x.is_cuda and x.dtype in (torch.float32, torch.float16, torch.bfloat16) else None)


@functools.cache
def _triton_module(name: str):
    """Imported on a CUDA tensor's first pass: the CPU path never imports Triton."""
    try:
        return importlib.import_module(f"sarathi_kernels.{name}")
    except ModuleNotFoundError as e:
        if e.name != "triton":
            raise
        return None


class RMSNorm(nn.Module):
    """Normalises in float32 and casts back before the weight, as transformers' LlamaRMSNorm."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if (ops := fused_ops(x)) is not None:
            out = ops.add_rms_norm(x, residual, self.weight, self.eps)
            return out if residual is None else (out, residual)
        if residual is not None:
            x = x + residual
            residual = x
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * h.to(x.dtype)
        return out if residual is None else (out, residual)


def rope_parameters(config: PretrainedConfig) -> dict:
    # transformers 5 keeps theta and scaling in rope_parameters; 4.x in rope_theta / rope_scaling.
    params = getattr(config, "rope_parameters", None)
    if params:
        return dict(params)
    params = dict(getattr(config, "rope_scaling", None) or {})
    params.setdefault("rope_type", params.pop("type", "default"))
    params["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    return params


class RotaryEmbedding(nn.Module):
    """Built with transformers' RoPE initialisers, so ``rope_scaling`` means what it means there."""

    def __init__(self, config: PretrainedConfig, head_dim: int, max_positions: int):
        super().__init__()
        params = rope_parameters(config)
        if params["rope_type"] == "default":
            exps = torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim
            inv_freq, scaling = 1.0 / (params["rope_theta"] ** exps), 1.0
        else:
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[params["rope_type"]](config,
                                                                         torch.device("cpu"))
        freqs = torch.arange(max_positions, dtype=torch.float)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        # Float32 whatever the dtype, as transformers keeps them; buffers would be cast by .to().
        self.cos, self.sin = emb.cos() * scaling, emb.sin() * scaling

    def tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cos.device != device:
            self.cos, self.sin = self.cos.to(device), self.sin.to(device)
        return self.cos, self.sin

    def forward(self, positions: torch.Tensor, qk: torch.Tensor) -> torch.Tensor:
        self.tables(positions.device)
        if (ops := fused_ops(qk)) is not None:
            ops.rope_(qk, positions, self.cos, self.sin)
            return qk
        cos = self.cos[positions].to(qk.dtype).unsqueeze(1)
        sin = self.sin[positions].to(qk.dtype).unsqueeze(1)
        return _rotate(qk, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class GatedMLP(nn.Module):

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = TunedLinear(hidden, 2 * intermediate, bias=False)
        self.down_proj = TunedLinear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (act := tuned_linear(x, self.gate_up_proj, gated=True)) is not None:
            return self.down_proj(act)  # SiLU * up was the gate_up GEMM's epilogue
        gate_up = self.gate_up_proj(x)
        if (ops := fused_ops(gate_up)) is not None:
            return self.down_proj(ops.silu_mul(gate_up))
        gate, up = gate_up.split(self.intermediate, dim=-1)
        return self.down_proj(nn.functional.silu(gate) * up)


class TunedLinear(nn.Linear):
    """A module still, so that forward hooks (measure/profiling/ops.py) see it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = tuned_linear(x, self)
        return super().forward(x) if out is None else out


def tuned_linear(x: torch.Tensor, layer: nn.Linear, gated: bool = False,
                 table: TunedTable | None = None) -> torch.Tensor | None:
    """Triton's split-K GEMM where the tuned table chose it; None: the caller runs cuBLAS."""
    table = table_for(x.device) if table is None else table
    if not table.gemm or not isinstance(layer, nn.Linear) or layer.bias is not None or x.dim() != 2:
        return None
    n, k = layer.weight.shape
    choice = table.gemm_for(n, k, x.shape[0], gated)
    if choice.kernel != "triton":
        return None
    gemm = _triton_module("gemm")
    if gemm is None:
        return None
    return gemm.gemm(x, layer.weight, gemm.GemmConfig(**choice.config_kwargs()), gated=gated)

