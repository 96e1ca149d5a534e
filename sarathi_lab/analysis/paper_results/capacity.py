"""Sarathi-Serve: capacity under latency SLOs (table, claim and bars: analysis/capacity.py)."""
from __future__ import annotations

import pandas as pd

from sarathi_lab.analysis import paper
from sarathi_lab.analysis.claims import claim_row
from sarathi_lab.analysis.paper_result import GpuPart, GpuRun, PaperResult, Unscaled, gpu_minutes

CLAIM = "sarathi_serve's capacity exceeds vllm's under the strict TBT SLO"


def searches(results) -> pd.DataFrame:
    """The capacity searches among the kept runs (their trials are runs too: left out)."""
    from sarathi_lab.analysis import capacity  # matplotlib: not at the registry's import

    kept = results.summary("capacity")
    found = capacity.load_searches(results.sweep("capacity"))
    if found.empty or kept.empty:
        return found
    return found[found.run_dir.isin(set(kept.run_dir))].reset_index(drop=True)


def claims(results) -> list[dict]:
    from sarathi_lab.analysis import capacity

    found = (capacity.gain(capacity.Evidence(searches=searches(results)))
             or capacity.Found("sarathi_serve and vllm not both searched", "n/a", ""))
    # The search brackets are one search's spread; seeds add theirs (claims._spread).
    return [claim_row("capacity", CLAIM,
                      f"{paper.CAPACITY_GAIN_OVER_VLLM}x (Mistral-7B, A100, strict 0.1 s)",
                      f"{found.ours}{f'; brackets {found.spread}' if found.spread else ''}",
                      found.holds, versus=found.versus)]


def figure(results, simulated=None):
    from sarathi_lab.analysis import capacity, figures

    rows = [(searches(runs), source)
            for runs, source in figures.sources_of(results, simulated, "capacity")]
    rows = [(found, source) for found, source in rows if not found.empty]
    # every search's runs left out: the caller says why
    if not rows:
        return None
    fig, axes = figures.subplots(1, len(rows), figsize=(7 * len(rows), 4.8), squeeze=False)
    for ax, (found, source) in zip(axes[0], rows):
        capacity.plot_capacity(found, ax, source)
    figures.headline(fig, results, "capacity",
                     "Sarathi-Serve: capacity under P99 TBT and scheduling-delay SLOs", simulated)
    return fig


# One GPU step, the strict SLO's (the claim's): minutes = 1.3 x (the calibrated H100 simulator's
# serving seconds of sarathi_serve's and vllm's searches (docs/sim/predictions_h100_1b71ba5.csv) + a
# second a search outside its trials + 10 s interpreter + 8 s to build, once: the sweep's searches
# share one engine).
GPU_PARTS = (GpuPart("strict", gpu_minutes(startup_s=18, job_s=1 + 187 / 2, jobs=2)),)
# Unscaled: the same from gpu.predict's seconds of the paper-shape searches, times each part's
# schedulers.
UNSCALED_PARTS = (GpuPart("strict", gpu_minutes(startup_s=10, job_s=(2004 + 3 * 8) / 3, jobs=3)),
                  GpuPart("relaxed", gpu_minutes(startup_s=10, job_s=(1347 + 2 * 8) / 2, jobs=2)))

RESULT = PaperResult(
    name="capacity", order=75, claims=claims, figure=figure,
    reading=("**Sarathi-Serve, capacity.** The highest request rate at which P99 TBT stays within "
             "the SLO and the median scheduling delay within 2 s, per scheduler and SLO: "
             f"stall-free batching serves {paper.CAPACITY_GAIN_OVER_VLLM}x vLLM's rate under the "
             "strict SLO in the paper."),
    gpu=GpuRun(minutes=sum(p.minutes for p in GPU_PARTS), order=75, parts=GPU_PARTS,
               unscaled=Unscaled(minutes=sum(p.minutes for p in UNSCALED_PARTS),
                                 parts=UNSCALED_PARTS)),
)
