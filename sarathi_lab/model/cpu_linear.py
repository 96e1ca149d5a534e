"""CPU linear layers over weights packed at load, kernel by row count (docs/cpu_engine.md)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from sarathi_kernels import cpu_ops
from sarathi_kernels.cpu_build import cpuinfo
from torch import nn

from sarathi_lab.engine.clock import WallClock
from sarathi_lab.engine.timer import best_time
from sarathi_lab.host_features import cpu_has_onednn_fp16

_PACK_ROWS_HINT = 8
_MKL_PACK_ROWS = 256
# How much faster the packed path must be on one row, so that noise never flips the choice.
_CLEAR_WIN = 1.2
# "auto"'s row boundaries; ATEN_ROWS: F.linear takes float32 from oneDNN without AVX-512.
SMALL_ROWS = cpu_ops.LINEAR_MAX_ROWS
FLOAT32_KERNEL_ROWS = 48
AMX_KERNEL_ROWS = 128
ATEN_ROWS = 768


def kernel_rows(dtype: torch.dtype) -> int:
    if dtype == torch.float32:
        return FLOAT32_KERNEL_ROWS
    return AMX_KERNEL_ROWS if dtype == torch.bfloat16 and cpu_ops.bf16_uses_amx() else SMALL_ROWS


GEMMS = ("mkl", "onednn")


def onednn_available(dtype: torch.dtype = torch.float32) -> bool:
    if not (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    if dtype == torch.float16:
        # config's own check for dtype=float16 (it tries the op): what it accepts, oneDNN runs.
        return cpu_has_onednn_fp16()
    return dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported()


def gemm_available(gemm: str, dtype: torch.dtype) -> bool:
    if gemm == "mkl":
        return (dtype == torch.float32 and torch.backends.mkl.is_available()
                and hasattr(torch.ops.mkl, "_mkl_linear"))
    return onednn_available(dtype)


def packed_gemm(cpu_linear: str, dtype: torch.dtype) -> str | None:
    wants_mkl = cpu_linear == "mkl" or (cpu_linear == "auto"
                                        and cpuinfo("vendor_id") == "GenuineIntel")
    if wants_mkl and gemm_available("mkl", dtype):
        return "mkl"
    return "onednn" if gemm_available("onednn", dtype) else None


def aten_from_rows(cpu_linear: str, dtype: torch.dtype, gemm: str | None) -> int | None:
    avx512 = "avx512f" in cpuinfo("flags").split()
    if cpu_linear == "auto" and gemm == "onednn" and dtype == torch.float32 and not avx512 \
            and torch.backends.mkl.is_available():
        return ATEN_ROWS
    return None


def describe(gemm: str, aten_rows: int | None) -> str:
    return gemm if aten_rows is None else f"{gemm}, aten from {aten_rows} rows"


class PackedLinear(nn.Module):
    """The nn.Linear's own parameters shared: tied embeddings and ``state_dict`` unchanged."""

    def __init__(self, linear: nn.Linear, gemm: str = "onednn", aten_rows: int | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.gemm, self.aten_rows = gemm, aten_rows
        self.repack()
        self.kernel_rows = kernel_rows(linear.weight.dtype) if self.small_rows_weight is not None \
            else 0
        self.one_row_packed = False  # set by pack_linears' probe

    @torch.no_grad()
    def repack(self) -> None:
        """The packed copies made again from ``weight`` (after its values changed in place)."""
        weight = self.weight.detach()
        if self.gemm == "mkl":
            packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, _MKL_PACK_ROWS)
        else:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_ROWS_HINT)
        self.register_buffer("packed_weight", packed, persistent=False)
        small = cpu_ops.pack_linear(weight) if cpu_ops.supports(weight) else None
        self.register_buffer("small_rows_weight", small, persistent=False)

    def _packed(self, x: torch.Tensor) -> torch.Tensor:
        if self.gemm == "mkl":
            # torch reads the packed weight only at the batch size passed; MKL's at any row count.
            return torch.ops.mkl._mkl_linear(x, self.packed_weight, self.weight, self.bias,
                                             x.shape[0])
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    @property
    def argmax_rows(self) -> int:
        return min(self.kernel_rows, cpu_ops.LINEAR_MAX_ROWS)

    def argmax(self, x: torch.Tensor) -> list[int]:
        """Greedy tokens taken in registers, without reading the logits back."""
        return cpu_ops.linear_argmax(x.contiguous(), self.small_rows_weight, self.out_features,
                                     self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if 0 < rows <= self.kernel_rows:
            return cpu_ops.linear(x.contiguous(), self.small_rows_weight, self.out_features,
                                  self.bias)
        if (rows < 2 and not self.one_row_packed) or (self.aten_rows and rows >= self.aten_rows):
            return F.linear(x, self.weight, self.bias)
        return self._packed(x)


def pack_linears(module: nn.Module, gemm: str = "onednn", aten_rows: int | None = None) -> None:
    """One row goes packed only where that beats MKL's GEMV on the largest layer."""
    packed = list(_replace(module, gemm, aten_rows))
    if not any(layer.small_rows_weight is None for layer in packed):
        return
    largest = max(packed, key=lambda m: m.weight.numel())
    x, clock = torch.randn(1, largest.in_features, dtype=largest.weight.dtype), WallClock()
    with torch.no_grad():
        one_row = (best_time(lambda: largest._packed(x), 5, clock) * _CLEAR_WIN
                   < best_time(lambda: F.linear(x, largest.weight, largest.bias), 5, clock))
    for layer in packed:
        layer.one_row_packed = one_row


def linear_gemm(module: nn.Module) -> str:
    return next((describe(m.gemm, m.aten_rows) for m in module.modules()
                 if isinstance(m, PackedLinear)), "aten")


def _replace(module: nn.Module, gemm: str, aten_rows: int | None):
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, PackedLinear(child, gemm, aten_rows))
            yield getattr(module, name)
        else:
            yield from _replace(child, gemm, aten_rows)
