"""Linear layers on the CPU over weights re-laid out once at load time: oneDNN's or MKL's GEMM.

Why: ``F.linear`` on the CPU calls MKL's GEMM, which at the row counts of decode batches reads the
weights far below the machine's copy bandwidth. A GEMM over a weight packed once into its blocked
layout (what torch.compile's CPU freezing pass emits for a frozen linear) does not pay that.

Dispatch by rows (``cpu_linear="auto"``; the measured gain of each boundary, per machine kind, is
in benchmarks/RESULTS.md):
- up to ``SMALL_ROWS`` (decode batches): sarathi_kernels' own linear over a second packed copy
  (csrc/linear_cpu.cpp), which streams the weights with software prefetch; bfloat16 on AMX tiles
  where the CPU has AMX. Without that kernel (no compiler, float16) one row goes wherever a probe
  at load time finds it faster, since some torch versions re-ordered the packed weight on every
  one-row call.
- float32 up to ``FLOAT32_KERNEL_ROWS``, bfloat16 on AMX up to ``AMX_KERNEL_ROWS``: the same
  kernel's GEMMs over the same packed copy; beyond them the libraries' blocked GEMMs reach a higher
  share of the FMA rate (and, for AMX, fewer tile loads from L2 per multiply-add).
- larger float32 batches on an Intel CPU, where torch has MKL: MKL's packed SGEMM (what
  torch.compile's freezing pass and IPEX emit for a float32 linear). On other vendors' CPUs oneDNN:
  MKL picks its code path by vendor and has fallen back to SSE code on AMD CPUs
  (pytorch/builder#504).
- float32 from ``ATEN_ROWS`` rows on a CPU without AVX-512 that "auto" gives to oneDNN (an AMD
  EPYC before Zen 4): ``F.linear`` over the weight as it is (MKL's SGEMM). MKL's own packed copy
  would be a fourth copy of every weight.

The packed copies triple the linear weights' memory (double for float16). ``cpu_linear="mkl"``
takes MKL's in float32 on any CPU (to measure it there), ``"onednn"`` keeps oneDNN for every dtype,
``"aten"`` opts out.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from sarathi_kernels import cpu_ops
from sarathi_kernels.cpu_build import cpuinfo
from torch import nn

from sarathi_lab.engine.clock import WallClock
from sarathi_lab.engine.timer import best_time

# The row count oneDNN packs the weight for: any hint from 2 to 512 gave a layout close to the best
# at every row count from 2 to 512.
_PACK_ROWS_HINT = 8
# The row count MKL packs the weight for. Any packing serves every row count (tested), but its speed
# depends on this: packed for a few rows, the GEMMs of 17-512 rows ran markedly slower.
_MKL_PACK_ROWS = 256
# How much faster the packed path must be on one row to take it: where it wins it wins clearly, and
# where it loses it loses by orders of magnitude, so a margin keeps noise from flipping the choice.
_CLEAR_WIN = 1.2
# The most rows that sarathi_kernels' linear takes here: all it can (it beat oneDNN at every row
# count up to its limit on every ISA build measured).
SMALL_ROWS = cpu_ops.LINEAR_MAX_ROWS
# The most float32 rows that sarathi_kernels' linear takes (its GEMM beyond SMALL_ROWS; above), and
# the most bfloat16 rows where bfloat16 runs on AMX tiles (above).
FLOAT32_KERNEL_ROWS = 48
AMX_KERNEL_ROWS = 128
# The fewest rows that F.linear (MKL's SGEMM) takes from oneDNN on a CPU without AVX-512 (above).
ATEN_ROWS = 768


def kernel_rows(dtype: torch.dtype) -> int:
    """The most rows of ``dtype`` that the engine gives sarathi_kernels' linear here."""
    if dtype == torch.float32:
        return FLOAT32_KERNEL_ROWS
    return AMX_KERNEL_ROWS if dtype == torch.bfloat16 and cpu_ops.bf16_uses_amx() else SMALL_ROWS


GEMMS = ("mkl", "onednn")


def onednn_available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether oneDNN can pack and run ``dtype`` weights here: bfloat16 and float16 need AVX-512 (or
    AVX-NE-CONVERT), and on an AVX2-only CPU oneDNN refuses to pack them."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    reduced = {torch.bfloat16: "_is_mkldnn_bf16_supported", torch.float16: "_is_mkldnn_fp16_supported"}
    return dtype not in reduced or getattr(torch.ops.mkldnn, reduced[dtype])()


def gemm_available(gemm: str, dtype: torch.dtype) -> bool:
    """Whether ``gemm`` (one of GEMMS) can run packed ``dtype`` weights here; MKL's is float32 only."""
    if gemm == "mkl":
        return dtype == torch.float32 and torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")
    return onednn_available(dtype)


def packed_gemm(cpu_linear: str, dtype: torch.dtype) -> str | None:
    """The GEMM that ``cpu_linear`` ("auto", "mkl" or "onednn") gives the rows that sarathi_kernels'
    linear does not take (above ``kernel_rows(dtype)``) in ``dtype``, or None
    where none can run it (the engine then keeps nn.Linear). MKL's runs float32
    only: other dtypes go to oneDNN's under "mkl" too."""
    wants_mkl = cpu_linear == "mkl" or (cpu_linear == "auto" and cpuinfo("vendor_id") == "GenuineIntel")
    if wants_mkl and gemm_available("mkl", dtype):
        return "mkl"
    return "onednn" if gemm_available("onednn", dtype) else None


def aten_from_rows(cpu_linear: str, dtype: torch.dtype, gemm: str | None) -> int | None:
    """The row count from which ``cpu_linear`` sends ``dtype`` rows to F.linear instead of ``gemm``
    (what ``packed_gemm`` chose), or None: never."""
    avx512 = "avx512f" in cpuinfo("flags").split()
    if cpu_linear == "auto" and gemm == "onednn" and dtype == torch.float32 and not avx512 \
            and torch.backends.mkl.is_available():
        return ATEN_ROWS
    return None


def describe(gemm: str, aten_rows: int | None) -> str:
    """How a model's linear rows beyond sarathi_kernels' linear run, as runs record it: "onednn", or
    "onednn, aten from 384 rows"."""
    return gemm if aten_rows is None else f"{gemm}, aten from {aten_rows} rows"


class PackedLinear(nn.Module):
    """The same parameters as the ``nn.Linear`` it replaces (shared, so tied embeddings and
    ``state_dict`` are unchanged) plus packed copies of the weight: the one ``gemm`` (oneDNN or MKL)
    reads, and (float32, bfloat16, kernels built) the one sarathi_kernels' few-row linear reads.
    From ``aten_rows`` rows on (None: never) F.linear runs over the weight itself."""

    def __init__(self, linear: nn.Linear, gemm: str = "onednn", aten_rows: int | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.gemm, self.aten_rows = gemm, aten_rows
        with torch.no_grad():
            if gemm == "mkl":
                packed = torch.ops.mkl._mkl_reorder_linear_weight(linear.weight.detach(), _MKL_PACK_ROWS)
            else:
                packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), _PACK_ROWS_HINT)
        self.register_buffer("packed_weight", packed, persistent=False)
        small = cpu_ops.pack_linear(linear.weight.detach()) if cpu_ops.supports(linear.weight) else None
        self.register_buffer("small_rows_weight", small, persistent=False)
        self.kernel_rows = kernel_rows(linear.weight.dtype) if small is not None else 0
        self.one_row_packed = False  # set by pack_linears' probe

    def _packed(self, x: torch.Tensor) -> torch.Tensor:
        if self.gemm == "mkl":
            # torch reads the packed weight only where the rows equal the batch size passed here (else
            # it runs F.linear on the original), but MKL's packed weight serves any row count, so the
            # rows themselves are passed (tests/test_cpu_linear.py checks every count from 1 to 600).
            return torch.ops.mkl._mkl_linear(x, self.packed_weight, self.weight, self.bias, x.shape[0])
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def _aten(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def _small(self, x: torch.Tensor) -> torch.Tensor:
        return cpu_ops.linear(x.contiguous(), self.small_rows_weight, self.out_features, self.bias)

    @property
    def argmax_rows(self) -> int:
        """The most rows whose argmax ``argmax`` takes inside the few-row kernel (0: none)."""
        return min(self.kernel_rows, cpu_ops.LINEAR_MAX_ROWS)

    def argmax(self, x: torch.Tensor) -> list[int]:
        """forward(x).argmax(-1).tolist() for 1 to argmax_rows rows, taken while the outputs are in
        registers: an LM head's greedy tokens without reading its logits back."""
        return cpu_ops.linear_argmax(x.contiguous(), self.small_rows_weight, self.out_features, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if 0 < x.shape[0] <= self.kernel_rows:
            return self._small(x)
        if (x.shape[0] < 2 and not self.one_row_packed) or (self.aten_rows and x.shape[0] >= self.aten_rows):
            return self._aten(x)
        return self._packed(x)


def _one_row_packed_wins(layer: PackedLinear, reps: int = 5) -> bool:
    """Whether oneDNN's packed path clearly beats MKL's GEMV on one row of ``layer``, timed here.

    Clearly: the two paths sum in different orders, so the choice reaches the last bits of float32
    results, and a close call decided by timing noise would make them differ between runs."""
    x = torch.randn(1, layer.in_features, dtype=layer.weight.dtype)
    clock = WallClock()
    with torch.no_grad():
        packed = best_time(lambda: layer._packed(x), reps, clock)
        aten = best_time(lambda: layer._aten(x), reps, clock)
    return packed * _CLEAR_WIN < aten


def pack_linears(module: nn.Module, gemm: str = "onednn", aten_rows: int | None = None) -> None:
    """Replace every ``nn.Linear`` under ``module`` (inputs [tokens, features]) by a PackedLinear over
    ``gemm`` (F.linear from ``aten_rows`` rows). Where sarathi_kernels' linear cannot take one row, it
    goes the way a probe on the largest layer finds faster on this machine."""
    packed = list(_replace(module, gemm, aten_rows))
    if not packed:
        return
    largest = max(packed, key=lambda m: m.weight.numel())
    if any(layer.small_rows_weight is None for layer in packed):
        one_row = _one_row_packed_wins(largest)
        for layer in packed:
            layer.one_row_packed = one_row


def linear_gemm(module: nn.Module) -> str:
    """How rows beyond sarathi_kernels' linear in ``module``'s linear layers run (``describe``), or "aten" where
    they were not packed (``cpu_linear="auto"`` picks by the CPU, so a run records which one ran)."""
    return next((describe(m.gemm, m.aten_rows) for m in module.modules() if isinstance(m, PackedLinear)), "aten")


def _replace(module: nn.Module, gemm: str, aten_rows: int | None):
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, PackedLinear(child, gemm, aten_rows))
            yield getattr(module, name)
        else:
            yield from _replace(child, gemm, aten_rows)
