"""cuBLAS against the Triton split-K GEMM at the hybrid batch's token counts, per projection: each
candidate checked against torch.matmul, timed interleaved with it, the fastest kept per shape. On a
CPU it dry-runs in Triton's interpreter (its times say nothing)."""
from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sarathi_lab.measure.profiling.attention_peers import rel_diff, time_interleaved
from sarathi_lab.model.shape import Shape
from sarathi_lab.tuned_kernels import GemmChoice, gemm_key

TOKENS = (128, 256, 512, 1024)
# Relative to the output's largest element: bf16 rounding of a K-long fp32 sum lies far below it.
MAX_REL_DIFF = 2e-2
# Each also split to fill the SMs (split_k_for) where that splits.
TILINGS = (GemmChoice("triton", 64, 128, 64, 1, 4, 3), GemmChoice("triton", 128, 128, 64, 1, 8, 3),
           GemmChoice("triton", 64, 256, 64, 1, 8, 3), GemmChoice("triton", 128, 64, 64, 1, 4, 4))


@dataclass(frozen=True)
class Projection:
    name: str  # gated: SiLU * up in the epilogue
    n: int
    k: int
    gated: bool

    @property
    def key(self) -> str:
        return gemm_key(self.n, self.k, self.gated)


def projections(shape: Shape) -> list[Projection]:
    """gate_up's output is SiLU(gate) * up on the Triton path: one launch, not two."""
    return [Projection(name, n, k, name == "gate_up_proj" and shape.gated)
            for name, (k, n) in shape.gemms.items()]


def candidates(proj: Projection, m: int, num_sms: int | None) -> list[GemmChoice]:
    from sarathi_kernels.gemm import GemmConfig, split_k_for

    chosen = []
    for tiling in TILINGS:
        splits = {1}
        if num_sms:
            config = GemmConfig(**tiling.config_kwargs())
            splits |= {split_k_for(m, proj.n, proj.k, num_sms, config, p) for p in (1, 2)}
        chosen += [GemmChoice("triton", tiling.block_m, tiling.block_n, tiling.block_k, s,
                              tiling.num_warps, tiling.num_stages) for s in sorted(splits)]
    return chosen


def label(choice: GemmChoice) -> str:
    if choice.kernel == "cublas":
        return "cublas"
    return (f"triton{choice.block_m}x{choice.block_n}x{choice.block_k}_s{choice.split_k}"
            f"_w{choice.num_warps}_st{choice.num_stages}")


def _calls(proj: Projection, x: torch.Tensor, w: torch.Tensor,
           choices: list[GemmChoice]) -> dict[str, tuple[GemmChoice, Callable[[], torch.Tensor]]]:
    from sarathi_kernels.gemm import GemmConfig, gemm
    from sarathi_kernels.pointwise import silu_mul

    def cublas():
        out = torch.matmul(x, w.T)
        # The engine's path without the fused epilogue: the GEMM, then the SiLU * up launch.
        return silu_mul(out) if proj.gated else out

    calls = {"cublas": (GemmChoice(), cublas)}
    for c in choices:
        config = GemmConfig(**c.config_kwargs())
        calls[label(c)] = (c, lambda config=config: gemm(x, w, config, gated=proj.gated))
    return calls


def sweep(proj: Projection, m: int, *, dtype: torch.dtype, device: torch.device, reps: int,
          warmup: int, num_sms: int | None,
          limit: int | None = None) -> tuple[GemmChoice, list[dict]]:
    """The fastest correct choice and one row per contender; ``limit``: at most this many."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = (torch.randn(m, proj.k, generator=gen) / proj.k**0.5).to(dtype).to(device)
    w = torch.randn(proj.n, proj.k, generator=gen).to(dtype).to(device)
    calls = _calls(proj, x, w, candidates(proj, m, num_sms)[:limit])
    reference = calls["cublas"][1]().float()
    rows, ok = [], {}
    for name, (choice, fn) in calls.items():
        try:
            diff = rel_diff(fn(), reference)
            error = "" if diff <= MAX_REL_DIFF else f"rel diff {diff:.3g} > {MAX_REL_DIFF}"
        except Exception as e:  # noqa: BLE001 (a config that does not compile is a result)
            first = str(e).splitlines()[0] if str(e) else ""
            diff, error = None, f"{type(e).__name__}: {first}"[:200]
        rows.append({"projection": proj.name, "key": proj.key, "m": m, "candidate": name,
                     "rel_diff": diff, "error": error})
        if not error:
            ok[name] = fn
    times = time_interleaved({name: calls[name][1] for name in ok}, reps, device, warmup)
    for row in rows:
        if row["candidate"] in times:
            row["ms"] = statistics.median(times[row["candidate"]])
    best = min(times, key=lambda name: statistics.median(times[name]))
    return calls[best][0], rows
