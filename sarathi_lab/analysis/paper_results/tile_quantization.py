"""Fig. 7: iteration time steps at multiples of the matmul tile."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from sarathi_lab.analysis import paper
from sarathi_lab.analysis.claim_attribution import attribution_row, floors_said
from sarathi_lab.analysis.claims import judged_row
from sarathi_lab.analysis.gpu_rejudge import Read
from sarathi_lab.analysis.paper_result import GpuRun, PaperResult, gpu_minutes
from sarathi_lab.analysis.verdict import Judged, judge

# Fig. 7: iteration time (ms) by tokens in the batch; the GPU's matmul tile is 128 tokens.
TILE_TIMES_MS = {128: 55.0, 256: 69.8, 257: 92.33}
TILE_JUMP = TILE_TIMES_MS[257] / TILE_TIMES_MS[256] - 1


def largest_step(times: pd.Series) -> tuple[int, float]:
    """Where the time per added token jumps most: n and the increase over the mean slope."""
    t = times.sort_index()
    slope = (t.iloc[-1] - t.iloc[0]) / (t.index[-1] - t.index[0])
    expected = t.shift(1) + slope * np.diff(t.index, prepend=np.nan)
    excess = (t - expected) / t.shift(1)
    n = int(excess.idxmax())
    return n, float(excess[n])


def iteration_ms(results) -> pd.Series:
    """Mean forward time (ms) by tokens in the batch, over the sweep's repeats."""
    sweep = results.table("tile_quantization", "sweep")
    return sweep[sweep.op == "total"].groupby("tokens").ms.mean()


def jump_point(jump: float) -> Judged:
    """One token past a tile multiple, ours' step against the paper's 256 -> 257."""
    return judge(1 + jump, 1 + TILE_JUMP)


def paper_step(times, tile: float) -> tuple[str, float] | None:
    """Ours at the paper's point, one token past two tiles (256 -> 257 at its tile of 128), where
    both counts were timed."""
    m = int(2 * tile)
    if m in times.index and m + 1 in times.index:
        return f"{m} -> {m + 1}", float(times[m + 1] / times[m] - 1)
    return None


def claims(results) -> list[dict]:
    summary = results.summary("tile_quantization")
    tile, jump = summary.tile.iloc[0], summary.tile_jump.mean()  # the mean over repeats, if any
    times = iteration_ms(results)
    step_at, step = largest_step(times)
    claim = f"One token past a multiple of the {tile:g}-token tile costs 10%+ more"
    # The paper's step where ours timed it, else ours' mean over the multiples timed.
    label, judged = paper_step(times, tile) or ("mean step", jump)
    at_paper = f"; {label}: {judged:+.1%}" if label != "mean step" else ""
    return [judged_row("tile_quantization", claim,
                       f"256 -> 257 tokens: +{TILE_JUMP:.0%} (tile {paper.TILE})",
                       f"{jump:+.1%} on average from m to m + 1 at multiples of {tile:g}; "
                       f"largest step anywhere: {step:+.1%} at {step_at} tokens{at_paper}",
                       [(label, jump_point(judged))], judged)]


def figure(results, simulated=None):
    from sarathi_lab.analysis import figures  # lazy: the registry imports without matplotlib

    sweep = results.table("tile_quantization", "sweep")
    tile = int(results.summary("tile_quantization").tile.iloc[0])
    fig, (ax, rel_ax) = figures.subplots(1, 2, figsize=(14, 4.2))
    shown = sweep[sweep.op.isin(["total", "qkv_proj", "o_proj", "ffn"])]
    figures.sns.lineplot(shown, x="tokens", y="ms", hue="op", ax=ax, marker=".", markersize=5,
                         errorbar=figures.SPREAD)
    for m in range(tile, int(sweep.tokens.max()) + 1, tile):
        ax.axvline(m, ls=":", color="grey")
    ax.set(title="iteration time (dotted: multiples of "
                 f"{tile})\n{figures.source_label(results, 'tile_quantization')}",
           xlabel="tokens in the iteration", ylabel="ms")
    styles = [{"marker": "."}, figures.SIM_STYLE | {"marker": None,
                                                    "color": figures.sim_colors(1)[0]}]
    for (runs, source), style in zip(figures.sources_of(results, simulated, "tile_quantization"),
                                     styles):
        total = iteration_ms(runs)
        run_tile = int(runs.summary("tile_quantization").tile.iloc[0])
        reference = total.index[abs(total.index - run_tile).argmin()]
        rel_ax.plot(total.index, total / total[reference],
                    label=f"{source} (/ time at {reference} tokens)", **style)
    paper_rel = {n: t / TILE_TIMES_MS[paper.TILE] for n, t in TILE_TIMES_MS.items()}
    rel_ax.scatter(list(paper_rel), list(paper_rel.values()),
                   label=f"paper (/ time at {paper.TILE} tokens)", **figures.PAPER_STYLE)
    sources = figures.panel_sources(results, simulated, "tile_quantization")
    rel_ax.set(title=f"relative to the time at one tile\n{sources}",
               xlabel="tokens in the iteration", ylabel="time / time at one tile (x)")
    rel_ax.legend(fontsize=8)
    figures.headline(fig, results, "tile_quantization",
                     "Fig. 7: iteration time steps at multiples of the matmul tile on a GPU",
                     simulated)
    return fig


def attribute(row: dict, lease, t) -> dict:
    """A tile step is a kernel's choice, never a floor's: the task times each token count's own
    forward (a graph of exactly that batch where the engine replays graphs), so ours is this
    device's kernels'."""
    floors, said = floors_said(lease, row)
    return attribution_row(row, "the device's kernels", "not separable from the lease's files",
                           "a tile step is a kernel's, never a floor's"
                           + (f" ({said})" if floors else "") + ": each token count runs at its "
                           f"exact tokens, so our steps are the {lease.device.upper()}'s kernels' "
                           "(cuBLAS's GEMMs, our attention's query tiles), not the A6000's of the "
                           "paper")


def _rejudge_tile(row, folder):
    m = re.search(r"([+-][0-9.]+)% on average", row["ours"])
    return Read([("mean step", jump_point(float(m[1]) / 100))]) if m else None


# A lease's row written before two-sided verdicts, by how its claim starts: re-judged from its
# text (analysis/gpu_rejudge.py).
REJUDGE = {
    "One token past": _rejudge_tile,
}


RESULT = PaperResult(
    name="tile_quantization", order=20, claims=claims, figure=figure,
    rejudge=REJUDGE,
    smoke_runs=((),),
    attribute=attribute,
    reading=("**Fig. 7, tile quantization.** On a GPU the iteration time steps up at multiples of "
             "the matmul tile (256 -> 257 tokens: +32%). Right: time relative to one tile's, the "
             "paper's three points as stars."),
    # 3 jobs, one a seed, each timing every 16th count (and m + 1 at each tile multiple m): half the
    # H200's step-8 job, and a graph captured for each count's every timing (three forwards more).
    gpu=GpuRun(minutes=gpu_minutes(startup_s=17, job_s=40, jobs=3), order=40),
)
