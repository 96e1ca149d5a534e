"""Fig. 11a: baseline, Orca's worst and best case, and SARATHI by sequence length."""
from __future__ import annotations

import pandas as pd

from sarathi_lab.analysis import derive, paper
from sarathi_lab.analysis.claims import judged_row, shown, why_left_out, with_range
from sarathi_lab.analysis.paper_result import GpuRun, PaperResult, Unscaled, gpu_minutes
from sarathi_lab.analysis.verdict import Judged, judge

ORDER = ["baseline", "Orca worst", "Orca best", "SARATHI", "SARATHI (tile-aligned)",
         "baseline (staggered)", "SARATHI (staggered)", "SARATHI (tile-aligned, staggered)"]
ALIGNED = "SARATHI (tile-aligned)"


def paper_ratio(length: float) -> tuple[float, str]:
    """The paper's SARATHI over Orca's best at ``length``, or at the nearest length it ran (and
    which, where not this one)."""
    ran = paper.ORCA_FIG11A["SARATHI"]
    nearest = min(ran, key=lambda n: abs(n - length))
    ratio = ran[nearest] / paper.ORCA_FIG11A["Orca best"][nearest]
    return ratio, "" if nearest == length else f" (paper's {nearest // 1024}K)"


def ratio_point(sarathi: pd.Series, best: pd.Series, length: float) -> tuple[str, Judged]:
    """SARATHI's gain over Orca's best at one length against the paper's; their runs' ranges
    bound the ratio's spread."""
    theirs, nearest = paper_ratio(length)
    label = f"length {length:g}{nearest}"
    sarathi, best = sarathi.dropna(), best.dropna()
    if sarathi.empty or best.empty:
        return label, Judged("n/a", why="not measured")
    repeated = len(sarathi) > 1 or len(best) > 1
    spread = (sarathi.min() / best.max(), sarathi.max() / best.min()) if repeated else None
    return label, judge(sarathi.mean() / best.mean(), theirs, spread)


def claims(results) -> list[dict]:
    gains = derive.orca_compare(results.summary("orca_compare"))
    # The paper sized its chunks to the tile: aligned runs, where any, are the verdict's.
    sarathi = ALIGNED if gains.variant.eq(ALIGNED).any() else "SARATHI"
    variants = list(dict.fromkeys([sarathi, "SARATHI", "Orca best", "Orca worst"]))
    # Every variant a column: one whose runs all failed is NaN (not judged), not a KeyError.
    table = (gains.pivot_table(index="seq_len", columns="variant", values="gain")
             .reindex(columns=variants))
    each = gains[gains.variant.isin(variants)].groupby(["seq_len", "variant"]).gain
    overlap = derive.prefill_overlap(results.table("orca_compare", "iterations"))
    best_runs = gains[gains.variant == "Orca best"].run_dir
    share = overlap[overlap.run_dir.isin(best_runs)].hybrid_share.mean()
    ratio = (table[sarathi] / table["Orca best"]).min()
    why = why_left_out(results, "orca_compare")

    def runs(s, v) -> pd.Series:
        return each.get_group((s, v)) if (s, v) in each.groups else pd.Series(dtype=float)

    def gain(s, v) -> str:
        return with_range(runs(s, v)) if (s, v) in each.groups else shown(None, "", why)

    return [judged_row("orca_compare", "SARATHI beats Orca's best case at every sequence length",
                       "SARATHI 1.27x / 1.25x / 1.23x, Orca "
                       "best 1.11x / 1.0x / 1.0x at 1K / 2K / 3K",
                       "; ".join(f"length {s:g}: " + ", ".join(f"{v} {gain(s, v)}"
                                                               for v in variants)
                                 for s in table.index)
                       + f" (over the runs, min-max; Orca best: {shown(share, '.0%', why)} of "
                         "prefill iterations carry decodes)",
                       [ratio_point(runs(s, sarathi), runs(s, "Orca best"), s)
                        for s in table.index],
                       None if pd.isna(ratio) else float(ratio))]


def _bars(runs) -> pd.DataFrame:
    summary = runs.summary("orca_compare")
    gains, variants = derive.orca_compare(summary), derive.orca_variants(summary)
    base = variants[variants.variant == "baseline"]
    # A fresh index: seaborn cannot draw repeated labels.
    return pd.concat([gains, base[["seq_len"]].assign(variant="baseline", gain=1.0)],
                     ignore_index=True)


def figure(results, simulated=None):
    from sarathi_lab.analysis import figures  # lazy: the registry imports without matplotlib

    colors = dict(zip(ORDER, figures.sns.color_palette("deep", len(ORDER))))
    panels = [(_bars(runs), source)
              for runs, source in figures.sources_of(results, simulated, "orca_compare")]
    ours = panels[0][0]
    theirs = pd.DataFrame([{"seq_len": s, "variant": v, "gain": g}
                           for v, by_len in paper.ORCA_FIG11A.items() for s, g in by_len.items()]
                          + [{"seq_len": s, "variant": "baseline", "gain": 1.0}
                             for s in (1024, 2048, 3072)])
    fig, axes = figures.subplots(1, len(panels) + 1, figsize=(8 * len(panels) + 6, 4.5),
                                 sharey=True, width_ratios=[3] * len(panels) + [2])
    paper_ax = axes[-1]
    order = [v for v in ORDER if v in set(ours.variant)]
    for ax, (bars, title) in zip(axes, panels):
        figures.sns.barplot(bars, x="seq_len", y="gain", hue="variant", palette=colors, ax=ax,
                            errorbar=figures.SPREAD,
                            hue_order=[v for v in ORDER if v in set(bars.variant)])
        ax.set(title=title, xlabel="sequence length (tokens)",
               ylabel="throughput over baseline (x)")
    figures.sns.barplot(theirs, x="seq_len", y="gain", hue="variant", palette=colors, ax=paper_ax,
                        errorbar=None,
                        hue_order=[v for v in order if v in set(theirs.variant)], alpha=0.6)
    paper_ax.set(title="paper (13B/A6000)", xlabel="sequence length (tokens)")
    for a in axes:
        a.axhline(1, color="black", lw=1)
        # Above the bars (gains stay under 1.5x), covering none.
        a.legend(fontsize=8, loc="upper center", ncol=3)
    top = max(1.6, 1.3 * max(p.get_height() for a in axes for p in a.patches))
    paper_ax.set_ylim(0, top)
    figures.headline(fig, results, "orca_compare",
                     "Fig. 11a: baseline, Orca worst and best case, SARATHI", simulated)
    return fig


RESULT = PaperResult(
    name="orca_compare", order=60, claims=claims, figure=figure,
    reading=("**Fig. 11a, Orca.** Orca's worst case (lock step, no overlap) and best case (every "
             "later whole prefill with B - 1 decodes), run by the `orca` scheduler on two "
             "workloads (see `experiments/orca_compare.yaml`), beside SARATHI; the paper's bars on "
             "the right. \"(staggered)\": the same scheduler on Orca's best-case workload, the "
             "first batch's decode lengths staggered by one token so that requests finish one by "
             "one and each later prefill runs beside decodes (`workload.stagger=batch_size`); "
             "without it, the lock-step workload (`workload.stagger=0`)."),
    # 3 seeds x 2 workloads x (static, orca, SARATHI fixed and aligned), static and orca once each
    # (sweep_check.collapse_ignored), at the H200's seconds and the H100's 1.37x; unscaled, 48 jobs.
    gpu=GpuRun(minutes=gpu_minutes(startup_s=21, job_s=6.6, jobs=24, slower=1.37), order=60,
               unscaled=Unscaled(minutes=gpu_minutes(startup_s=21, job_s=(6.6 + 12.5) / 2, jobs=48,
                                                     slower=1.37))),
)
