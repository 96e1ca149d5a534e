"""Linear layers on the CPU over weights re-laid out once at load time: oneDNN's or MKL's GEMM.

Why: ``F.linear`` on the CPU calls MKL's GEMM, which at the row counts of decode batches runs far
below the machine's rate (at 8 rows it reads cpu-small's weights at ~5 GB/s where a copy runs at
~17). oneDNN's matmul over a weight packed once into its blocked layout (what torch.compile's CPU
freezing pass emits for a frozen linear) is 1.2-1.7x faster from 2 rows to 512 on cpu-small's
shapes in isolation; in the engine, batch-8 decode iterations run 1.23x faster on 1 thread and
1.43x on 2, prefill about even.

Decode batches of up to ``SMALL_ROWS`` rows (float32, bfloat16) go to sarathi_kernels' own linear
over a second packed copy (csrc/linear_cpu.cpp): streaming cpu-small's twelve layers' weights it
reads them at 22-33 GB/s where oneDNN reads 14-22, 1.2-1.75x from 1 row to 12, and since its
software prefetch 1.14-1.5x at 13-16 rows on every ISA kind measured (AMD EPYC Zen 4, 2 threads;
benchmarks/RESULTS.md); on a Sapphire Rapids Xeon its bfloat16 AMX path 1.27-1.41x at 1-16 rows. Without that kernel (no compiler, float16) one row goes wherever a probe at
load time finds it faster: oneDNN's packed path was 1.6x (float32) / 1.8x (bfloat16) faster than
MKL's GEMV with torch 2.13, while an earlier torch re-ordered the packed weight on every one-row
call (100x slower). The packed copies triple the linear weights'
memory (double for float16); ``EngineConfig(cpu_linear="aten")`` opts out.

In float32 that kernel also takes the batches of up to ``FLOAT32_KERNEL_ROWS`` rows, through a GEMM
over the same packed copy (six rows at a time against four tiles with AVX-512, two with AVX2, span
by span): decode batches of 17-48 requests. Measured on cpu-small's 48 GEMMs, weights streamed from
memory, 2 threads, against what "auto" took before on each kind (benchmarks/RESULTS.md, session 27):
on the Xeon with AMX 1.43-1.47x MKL's packed SGEMM at 17 rows, 1.17x at 32, 1.04-1.05x at 48, 0.88-0.95x
at 64; held to AVX2 there 1.59x oneDNN's at 17 rows, 1.26x at 32, 1.07x at 48, 1.04x at 64; held to
AVX-512 with bf16 units (a Zen 4's code) 1.43x / 1.26x / 1.14x / 1.09x, held to AVX-512 with VNNI (a
Xeon without bf16 units) 1.45x MKL's / 1.20x / 1.09x / 0.99x. From 64 rows on the libraries'
blocked GEMMs run at up to 87% of the FMA rate where this one stays near 60%.

In bfloat16 on a CPU with AMX the kernel takes up to ``AMX_KERNEL_ROWS`` rows: beyond 16, 32-row
groups against two tiles of weights on the tile registers. cpu-small's 48 GEMMs, streamed, 2 threads,
on the Xeon with AMX: 1.17-1.25x oneDNN's (AMX too) at 17-32 rows, 1.14-1.16x at 64-96, 1.09-1.11x
at 128, 0.96x at 160 and 0.76-0.82x at 256, where its tile loads from L2 bound it (two per two
multiply-adds) and oneDNN's blocking reaches 2 TFLOP/s (benchmarks/RESULTS.md, session 27).

In float32 on an Intel CPU, where torch has MKL, ``cpu_linear="auto"`` gives the rows above
``FLOAT32_KERNEL_ROWS`` to MKL's packed SGEMM instead of oneDNN (what torch.compile's freezing pass and
IPEX emit for a float32 linear): on a Sapphire Rapids-class Xeon, cpu-small's prefill iterations ran
1.07-1.14x faster, hybrid 1.06-1.10x (and decode-32, before the kernel took it, 1.02-1.05x), measured
side by side in one process;
held to AVX2 there, 1.00-1.07x (benchmarks/RESULTS.md, session 19). On other vendors' CPUs "auto"
keeps oneDNN: MKL picks its code path by vendor, it has fallen back to SSE code for SGEMM on AMD CPUs
before (pytorch/builder#504), and on an AMD EPYC Zen 3 its packed GEMM ran 0.51-0.89x of oneDNN's at
17-128 rows (session 25). ``cpu_linear="mkl"`` takes MKL's in float32 on any CPU, to measure it there;
``cpu_linear="onednn"`` keeps oneDNN for every dtype.

On a CPU without AVX-512 that "auto" gives to oneDNN (an AMD EPYC before Zen 4), float32 rows from
``ATEN_ROWS`` on go to ``F.linear`` over the weight as it is, which is MKL's SGEMM: on an EPYC Zen 3,
one engine's prefill iterations, the two paths alternating, ran 1.07x faster at 768 tokens and
1.09-1.12x at 1,024-2,048, and a 16-prompt batch prefilled whole (4,940 rows) 1.10x; at 256-512 rows
0.92-1.03x, no win (benchmarks/RESULTS.md, session 25). MKL's own packed copy ran a few percent
faster still in isolation, but would be a fourth copy of every weight.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from sarathi_kernels import cpu_ops
from sarathi_kernels.cpu_build import cpuinfo
from torch import nn

from sarathi_lab.engine.clock import WallClock
from sarathi_lab.engine.timer import best_time

# The row count oneDNN packs the weight for; measured on cpu-small, any hint from 2 to 512 gives
# within 10% of the best layout at every row count from 2 to 512.
_PACK_ROWS_HINT = 8
# The row count MKL packs the weight for. Any packing serves every row count (tested), but its speed
# depends on this: cpu-small's GEMMs at 17-512 rows ran fastest packed for 128-256 rows and up to 2x
# slower packed for 8 (Xeon with AMX; held to AVX2, 256 within 2% of the best at 17-512 rows).
_MKL_PACK_ROWS = 256
# How much faster the packed path must be on one row to take it (measured 1.6-1.8x where it wins,
# 100x slower where it loses).
_CLEAR_WIN = 1.2
# The most rows that sarathi_kernels' linear takes here: all it can. Measured 1.2-1.75x faster than
# oneDNN up to 12 rows and, once it prefetched its weights (session 10), 1.14-1.5x at 13-16 rows with
# AVX-512, AVX2 and bf16 builds alike (AMD EPYC Zen 4, cpu-small's weights streamed from memory).
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
