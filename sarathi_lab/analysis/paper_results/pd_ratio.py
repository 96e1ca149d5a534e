"""Fig. 9/11b: SARATHI's throughput over the baseline by P:D, peaking at C / (B - 1)."""
from __future__ import annotations

import re

import pandas as pd

from sarathi_lab.analysis import derive, paper, verdict
from sarathi_lab.analysis.claims import judged_row, simulated
from sarathi_lab.analysis.gpu_rejudge import Read, X, sweep_table
from sarathi_lab.analysis.paper_result import GpuRun, PaperResult, Unscaled, gpu_minutes
from sarathi_lab.analysis.verdict import SIZE, Judged, judge
from sarathi_lab.executors import recorded_as

# Fig. 9 / 11b: the gain peaks at P:D = C / (B - 1); about 10% over a wide range of P:D.
PD_PEAKS = [  # (chunk, batch_size, pd_ratio, normalised throughput)
    (256, 18, 14, 1.27),
    (512, 18, 28, 1.23),
]
PD_WIDE_GAIN = 1.10

# The paper's peak gain by chunk (Fig. 9); a chunk it gives none for is judged against the span of
# its gains, ~10% over a wide range up to the highest peak.
PEAK_GAIN = {chunk: gain for chunk, _, _, gain in PD_PEAKS}
SPAN = (PD_WIDE_GAIN, max(PEAK_GAIN.values()))


def pd_gains(summary: pd.DataFrame) -> pd.DataFrame:
    """Each sarathi run over the static runs just before it (same workload): drifts hit both."""
    gains = derive.normalised_throughput(summary.assign(chunk_align=derive.chunk_align(summary)),
                                         keys=(*derive.WORKLOAD_KEYS, "chunk"))
    return derive.with_effective_chunk(gains.dropna(subset=["gain"]), summary)


def pd_spread(summary: pd.DataFrame) -> pd.DataFrame:
    """Per sarathi point (workload, chunk, alignment): its gain's ``low`` and ``high`` over every
    repeat of both sides, and ``repeats`` (runs behind it). static ignores the chunk, so the static
    runs of one workload at every chunk and seed repeat one baseline: their range is its noise."""
    metric, keys = "total_throughput_tok_s", list(derive.WORKLOAD_KEYS)
    runs = summary.assign(chunk_align=derive.chunk_align(summary)).dropna(subset=[metric])
    base = (runs[runs.scheduler == derive.BASELINE].groupby(keys)[metric]
            .agg(base_low="min", base_high="max", base_runs="count"))
    point = [*keys, "chunk", "chunk_align"]
    ours = (runs[runs.scheduler != derive.BASELINE].groupby(point)[metric]
            .agg(ours_low="min", ours_high="max", ours_runs="count").reset_index())
    out = ours.join(base, on=keys).dropna(subset=["base_low"])
    return out.assign(low=out.ours_low / out.base_high, high=out.ours_high / out.base_low,
                      repeats=out.ours_runs + out.base_runs)[[*point, "low", "high", "repeats"]]


def optimal_pd_ratio(chunk: float, batch_size: float) -> float:
    """P:D at which one chunk and B - 1 decodes fill every iteration: C / (B - 1)."""
    return chunk / (batch_size - 1) if batch_size > 1 else float("inf")


def pd_peaks(normalised: pd.DataFrame) -> pd.DataFrame:
    """Per point: the P:D of the largest gain, the gain, the paper's predicted peak."""
    keys = ["chunk", *(["chunk_align"] if "chunk_align" in normalised else []), "batch_size",
            "seq_len"]
    idx = normalised.groupby(keys).gain.idxmax()
    ran = "effective_chunk" if "effective_chunk" in normalised else "chunk"
    peaks = normalised.loc[idx, [*keys, "pd_ratio", "gain", *([ran] if ran != "chunk" else [])]]
    peaks["predicted_pd_ratio"] = [optimal_pd_ratio(c, b)
                                   for c, b in zip(peaks[ran], peaks.batch_size)]
    return peaks.reset_index(drop=True)


def points(summary: pd.DataFrame) -> pd.DataFrame:
    """Each sarathi point's mean gain (its repeats' mean: single runs' peak favours the luckiest)
    with its spread over the repeats (``low``, ``high``; NaN for one run a side)."""
    gains = pd_gains(summary)
    keys = [*derive.WORKLOAD_KEYS, "chunk", "chunk_align"]
    normalised = gains.groupby([*keys, "effective_chunk"], as_index=False).gain.mean()
    spread = pd_spread(summary)
    # One run a side repeats nothing: no spread.
    spread.loc[spread.repeats <= 2, ["low", "high"]] = float("nan")
    return normalised.merge(spread.drop(columns="repeats"), on=keys, how="left")


def _spread(p) -> tuple[float, float] | None:
    return None if pd.isna(p.low) else (p.low, p.high)


def peak_points(judged: pd.DataFrame) -> list[tuple[str, Judged, Judged]]:
    """Per chunk and batch: (label, where its gain peaks against C / (B - 1), its peak gain against
    the paper's); a peak inside its own spread is unresolved, and so is where it lies."""
    out = []
    keys = [*derive.WORKLOAD_KEYS, "chunk", "chunk_align"]
    for p in pd_peaks(judged).merge(judged[[*keys, "low", "high"]], on=keys).itertuples():
        gain = judge(p.gain, PEAK_GAIN.get(p.chunk, SPAN), _spread(p))
        if gain.word == "unresolved":
            where = gain
        elif p.gain <= 1:
            where = Judged("no", why=f"no gain: best {p.gain:.2f}x")
        else:
            where = judge(p.pd_ratio, p.predicted_pd_ratio, kind=SIZE)
        out.append((f"C={p.chunk:g} B={p.batch_size:g}", where, gain))
    return out


def claims(results) -> list[dict]:
    normalised = points(results.summary("pd_ratio"))
    # The paper sized its chunks to the tile: aligned runs, where any, are the verdict's.
    aligned = normalised.chunk_align.eq("tile")
    judged = normalised[aligned] if aligned.any() else normalised
    label = "tile-aligned chunks: " if aligned.any() and (~aligned).any() else ""
    peaks = pd_peaks(judged)
    each = peak_points(judged)
    # A resolved point's gain: those inside their spread are left out of the range.
    kept = judged[[_spread(p) is None or verdict.resolved(_spread(p))
                   for p in judged.itertuples()]]
    best = judged.gain.max()
    wide = (kept.gain >= PD_WIDE_GAIN).sum()
    left = (f" ({len(judged) - len(kept)} inside their spread left out)"
            if len(kept) < len(judged) else "")
    fixed = (f"; fixed chunk: peak {normalised[~aligned].gain.max():.2f}x" if label else "")
    return [
        judged_row("pd_ratio", "The gain peaks at P:D = C / (B - 1) (within a factor 2)",
                   "; ".join(f"C={c} B={b}: P:D {pd:g}" for c, b, pd, _ in PD_PEAKS),
                   label + "; ".join(f"C={p.chunk:g} B={p.batch_size:g}: best {p.gain:.2f}x at "
                                     f"{p.pd_ratio:g}, predicted peak {p.predicted_pd_ratio:.3g}"
                                     for p in peaks.itertuples()),
                   [(name, where) for name, where, _ in each]),
        judged_row("pd_ratio",
                   f"SARATHI gains {PD_WIDE_GAIN - 1:.0%}+ over the baseline at its best P:D",
                   "; ".join(f"{g:g}x at C={c} B={b} P:D={pd:g}" for c, b, pd, g in PD_PEAKS)
                   + f"; ~{PD_WIDE_GAIN - 1:.0%} over a wide range",
                   f"{label}peak {best:.2f}x; {wide} of {len(kept)} points >= "
                   f"{PD_WIDE_GAIN:g}x{left}; lowest {judged.gain.min():.2f}x{fixed}",
                   [(name, gain) for name, _, gain in each], best,
                   why=_why(results) if simulated(results, "pd_ratio") else ""),
    ]


def _why(simulated) -> str:
    """Why the simulated gains stay below the paper's where chunks fill whole GEMM tiles; ''."""
    gains = pd_gains(simulated.summary("pd_ratio"))
    if gains.gain.max() >= PD_WIDE_GAIN or (gains.chunk % paper.TILE).any():
        return ""
    chunk, size = gains.chunk.min(), gains.batch_size.max()
    padded = -(-(chunk + size - 1) // paper.TILE) * paper.TILE
    return ("Simulated gains below the paper's: each hybrid iteration's chunk and its B - 1 = "
            f"{size - 1:g} decodes cross a multiple of the {paper.TILE}-token GEMM tile, which the "
            f"cost model charges in full (chunk {chunk:g}: {chunk + size - 1:g} tokens computed as "
            f"{padded:g}), so the smaller the chunk the larger the loss; the paper keeps chunk + "
            "decodes a multiple of the tile, these runs do not.")


def figure(results, simulated=None):
    from sarathi_lab.analysis import figures  # lazy: the registry imports without matplotlib

    norm = pd_gains(results.summary("pd_ratio"))
    chunks = sorted(norm.chunk.unique())
    palette = dict(zip(chunks, figures.sns.color_palette("tab10", len(chunks))))
    fig, ax = figures.subplots(figsize=(11, 4.5))
    # Aligned and fixed chunks as line styles where both were swept.
    style = "chunk_align" if norm.chunk_align.nunique() > 1 else "batch_size"
    # Hue only with a chunk to colour (else seaborn warns instead of drawing).
    hue = "chunk" if norm.chunk.notna().any() else None
    figures.sns.lineplot(norm, x="pd_ratio", y="gain", hue=hue, style=style, markers=True,
                         palette=palette if hue else None, ax=ax, errorbar=figures.SPREAD)
    figures.fold_group_headers(ax, norm, {"chunk": f"{results.source('pd_ratio')}, C=",
                                          "batch_size": "B="})
    for p in pd_peaks(norm).itertuples():
        ax.axvline(p.predicted_pd_ratio, color=palette[p.chunk], ls="--", lw=1)
    label = figures.simulated_label(simulated, "pd_ratio")
    if label:
        sim = pd_gains(simulated.summary("pd_ratio"))
        groups = sim.groupby(["chunk", "batch_size"])
        for color, ((chunk, size), g) in zip(figures.sim_colors(groups.ngroups), groups):
            g = g.groupby("pd_ratio").gain.mean()
            ax.plot(g.index, g.values, color=color, label=f"{label}, C={chunk:g} B={size:g}",
                    **figures.SIM_STYLE)
    for i, (c, b, pd_, g) in enumerate(PD_PEAKS):
        ax.scatter([pd_], [g], **figures.PAPER_STYLE, label="paper's peaks (13B/A6000)" if i == 0
                   else None)
        ax.annotate(f"C={c} B={b}", (pd_, g), textcoords="offset points", xytext=(-9, -3),
                    ha="right", fontsize=8)
    ax.axhline(1, color="black", lw=1, label="baseline (1x)")
    ax.axhline(PD_WIDE_GAIN, color="black", lw=1, ls=":",
               label=f"paper: ~{PD_WIDE_GAIN - 1:.0%} gain over a wide range")
    ax.plot([], [], color="grey", ls="--", lw=1, label="predicted peak C / (B - 1)")
    ax.set(xscale="log", xlabel="P:D (prompt / decode tokens)",
           ylabel="throughput over baseline (x)",
           title=(figures.panel_sources(results, simulated, "pd_ratio")
                  + "\nvertical dashed: C / (B - 1), each chunk"))
    figures.plain_log_ticks(ax.xaxis)
    figures.legend_outside(ax, fontsize=7)
    why = [_why(runs) for runs, _ in figures.sources_of(results, simulated, "pd_ratio")
           if recorded_as(runs.executor("pd_ratio")["executor"], "simulated")]
    figures.headline(fig, results, "pd_ratio", "Fig. 9/11b: the gain peaks where P:D = C / (B - 1)",
                     simulated, why)
    return fig


# The H200's (eager) seconds of static and sarathi per P:D, which fit static 3.5 + 0.074 D s and
# sarathi 4.3 + 0.084 D s (D = 1024 / (1 + P:D)).
PAIR_S = {7: 13 + 15, 14: 8.5 + 11.4, 28: 6.1 + 7.2}
UNSCALED_PD = (2, 5, 10, 14, 20, 28, 50, 100)
# Seconds of one seed, chunk and alignment of the paper's grid, by the fits above.
GRID_S = (len(UNSCALED_PD) * (3.5 + 4.3)
          + (0.074 + 0.084) * sum(1024 / (1 + pd) for pd in UNSCALED_PD))


# Where a re-judged row's points come from.
FROM_TABLE = ("from the lease's runs (its sweep table): static ignores the chunk, so its runs at "
              "each chunk repeat one baseline, whose range is the spread")


def _rejudge_pd_table(folder) -> tuple[pd.DataFrame, str] | None:
    """The pd_ratio points from the lease's sweep table, and the spread of its baseline."""
    table = sweep_table(folder, "pd_ratio")
    if table is None:
        return None
    base = (table[table.scheduler == derive.BASELINE].groupby(list(derive.WORKLOAD_KEYS))
            .total_throughput_tok_s.agg(["min", "max", "count"]))
    base = base[base["count"] > 1]
    apart = (base["max"] / base["min"]).max() - 1 if len(base) else None
    spread = ("its baseline's repeats (static at each chunk) up to "
              f"{apart:.0%} apart" if apart is not None else "")
    return points(table), spread


def _rejudge_pd_peak(row, folder):
    found = _rejudge_pd_table(folder)
    if found is None:
        peaks = re.findall(rf"C=(\d+) B=(\d+): best {X} at ([0-9.]+), predicted peak ([0-9.]+)",
                           row["ours"])
        return Read([(f"C={c} B={b}", judge(float(pd_), float(pred), kind=SIZE)
                      if float(g) > 1 else Judged("no", why=f"no gain: best {float(g):.2f}x"))
                     for c, b, g, pd_, pred in peaks], "from the row's text") if peaks else None
    points, spread = found
    return Read([(name, where) for name, where, _ in peak_points(points)], FROM_TABLE,
                spread)


def _rejudge_pd_gain(row, folder):
    found = _rejudge_pd_table(folder)
    if found is None:
        return None  # the peaks per chunk are the other row's text: no runs, no re-judging
    points, spread = found
    return Read([(name, gain) for name, _, gain in peak_points(points)], FROM_TABLE,
                spread)


# A lease's row written before two-sided verdicts, by how its claim starts: re-judged from its
# text (analysis/gpu_rejudge.py).
REJUDGE = {
    "The gain peaks": _rejudge_pd_peak,
    "SARATHI gains": _rejudge_pd_gain,
}


RESULT = PaperResult(
    name="pd_ratio", order=40, claims=claims, figure=figure,
    rejudge=REJUDGE,
    # Both schedulers at two ratios: the gain the comparison plots, measured and simulated.
    smoke_runs=tuple((f"pd_ratio={ratio}", f"scheduler={scheduler}")
                     for ratio in (4, 16) for scheduler in ("static", "sarathi")),
    reading=("**Fig. 9/11b, P:D.** End-to-end throughput over the baseline peaks where one chunk "
             "and B - 1 decodes fill every iteration, P:D = C / (B - 1) (dashed); the paper's "
             "peaks as stars."),
    gpu=GpuRun(minutes=gpu_minutes(startup_s=21, job_s=sum(PAIR_S.values()) / 6, jobs=18), order=30,
               unscaled=Unscaled(minutes=gpu_minutes(startup_s=21, job_s=GRID_S / 16,
                                                     jobs=288))),
)
