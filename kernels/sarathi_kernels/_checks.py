"""Argument checks shared by the kernel wrappers: one clear ValueError instead of a crash or garbage."""
from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def require_dim(name: str, t: torch.Tensor, ndim: int, layout: str) -> None:
    require(t.dim() == ndim, f"{name} must be {ndim}-D {layout}, got shape {tuple(t.shape)}")


def require_int(name: str, t: torch.Tensor, dtype: torch.dtype, ndim: int) -> None:
    require(t.dtype == dtype, f"{name} must be {dtype}, got {t.dtype}")
    require(t.dim() == ndim, f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    # Index tensors are read with unit stride along their last axis.
    require(t.shape[-1] == 0 or t.stride(-1) == 1, f"{name} must have unit stride in its last dim")


def require_unit_last_stride(name: str, t: torch.Tensor) -> None:
    require(t.stride(-1) == 1, f"{name} must be contiguous in its last dim, got strides {t.stride()}")


def require_same_device(**tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")


def padded_head_dim(head_dim: int) -> int:
    """tl.arange needs a power of two and tl.dot a K of at least 16; the pad lanes are masked."""
    return max(16, 1 << (head_dim - 1).bit_length())
