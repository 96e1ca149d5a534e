"""Sarathi-Serve: capacity under latency SLOs (task=capacity searches), sarathi_serve against vllm.

The searches' table, the claim and the bars are analysis/capacity.py's (docs/capacity/ draws the
committed tables with them); this module reads them from a results root as every paper result does,
so that produce, the claims table and the GPU suite (``paper.capacity``) find the searches."""
from __future__ import annotations

import pandas as pd

from sarathi_lab.analysis import paper
from sarathi_lab.analysis.claims import claim_row
from sarathi_lab.analysis.paper_result import GpuPart, GpuRun, PaperResult, Unscaled

CLAIM = "sarathi_serve's capacity exceeds vllm's under the strict TBT SLO"


def searches(results) -> pd.DataFrame:
    """The capacity searches among the experiment's kept runs (its trials are runs too: left out)."""
    from sarathi_lab.analysis import capacity  # matplotlib: not at the registry's import

    kept = results.summary("capacity")
    found = capacity.load_searches(results.sweep("capacity"))
    if found.empty or kept.empty:
        return found
    return found[found.run_dir.isin(set(kept.run_dir))].reset_index(drop=True)


def claims(results) -> list[dict]:
    from sarathi_lab.analysis import capacity

    found = capacity._gain(capacity.Evidence(searches=searches(results)))
    ours, holds, spread = found or ("sarathi_serve and vllm not both searched", "n/a", "")
    # The search brackets are the spread of one search; seeds, where run, add theirs (claims._spread).
    return [claim_row("capacity", CLAIM, f"{paper.CAPACITY_GAIN_OVER_VLLM}x (Mistral-7B, A100, strict 0.1 s)",
                      f"{ours}{f'; brackets {spread}' if spread else ''}", holds)]


def figure(results, simulated=None):
    from sarathi_lab.analysis import capacity, figures

    rows = [(searches(runs), source) for runs, source in figures.sources_of(results, simulated, "capacity")]
    rows = [(found, source) for found, source in rows if not found.empty]
    if not rows:  # every search's runs left out (unreliable trials): the caller says why in its place
        return None
    fig, axes = figures.subplots(1, len(rows), figsize=(7 * len(rows), 4.8), squeeze=False)
    for ax, (found, source) in zip(axes[0], rows):
        capacity.plot_capacity(found, ax, source)
    figures.headline(fig, results, "capacity", "Sarathi-Serve: capacity under P99 TBT and scheduling-delay SLOs",
                     simulated)
    return fig


# On the GPU: Mistral-7B bf16 on the arxiv_summarization lengths (prompt median 2,730, decode 167), the
# paper's SLOs, sarathi_serve at the paper's budgets (512 strict, 2048 relaxed), vllm and orca. Scaled:
# each trial serves the first 10 s of its Poisson arrivals (at least 16 requests; the paper's traces
# run for minutes), a 25% bracket in at most 4 trials started at the capacity the calibrated H100
# simulator predicts; docs/gpu/README.md gives the arithmetic and docs/sim/ the predictions at both
# scales. Shared by both parts: max_num_batched_tokens=4096 is sarathi-serve's vLLM baseline.
GPU_SHAPE = "model=mistral-7b workload=trace_lengths seq_len=4096 batch_size=36 token_budget=null capacity.min_qps=0.25"
GPU_COMMON = (f"{GPU_SHAPE} workload.num_requests=256 capacity.trial_s=10 capacity.min_requests=16 "
              "capacity.resolution=0.25 capacity.max_trials=4")

# One step an SLO, each with the paper's budget for it: minutes = 1.3 x (the calibrated H100 simulator's
# trials' serving seconds + 8 s a search to build the model + 10 s for the interpreter); the eager
# profile tables predict about twice the serving seconds (docs/gpu/README.md), and a search cut short
# resumes at its next trial.
GPU_PARTS = (GpuPart("strict", "slo=strict chunk=512 scheduler=sarathi_serve,vllm,orca capacity.start_qps=6", 6.7),
             GpuPart("relaxed", "slo=relaxed chunk=2048 scheduler=sarathi_serve,vllm capacity.start_qps=8", 5.0))
# Unscaled (an own GPU, no call budget): the search of the paper-shape simulation (experiment=capacity_sim:
# 512 requests a trial, all served, which it finds gives the paper's 2048's capacities within the
# resolution; 5% in at most 14 trials); minutes as above from the calibrated H100 simulator's trials
# (gpu.predict on these jobs: 2004 s strict, 1347 s relaxed), + 8 s a search + 10 s, x 1.3.
UNSCALED_MINUTES = {"strict": 44.2, "relaxed": 29.7}
UNSCALED = Unscaled(
    overrides=f"{GPU_SHAPE} workload.num_requests=512 capacity.trial_s=null capacity.resolution=0.05 "
              "capacity.max_trials=14",
    minutes=sum(UNSCALED_MINUTES.values()),
    parts=tuple(GpuPart(p.name, p.overrides, UNSCALED_MINUTES[p.name]) for p in GPU_PARTS))

RESULT = PaperResult(
    name="capacity", order=75, claims=claims, figure=figure,
    reading=("**Sarathi-Serve, capacity.** The highest request rate at which P99 TBT stays within the SLO and "
             "the median scheduling delay within 2 s, per scheduler and SLO: stall-free batching serves "
             f"{paper.CAPACITY_GAIN_OVER_VLLM}x vLLM's rate under the strict SLO in the paper."),
    gpu=GpuRun(minutes=sum(p.minutes for p in GPU_PARTS), order=75, overrides=GPU_COMMON,
               dry="token_budget=null seq_len=96 chunk=32 batch_size=4 workload.num_requests=24 workload.min_tokens=32 "
                   "slo=strict slo.tbt_p99_s=0.25 capacity.start_qps=20 capacity.trial_s=0.5 capacity.resolution=0.5 "
                   "capacity.max_trials=3 scheduler=sarathi_serve",
               parts=GPU_PARTS, unscaled=UNSCALED),
)
