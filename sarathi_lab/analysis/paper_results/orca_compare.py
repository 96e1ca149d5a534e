"""Fig. 11a: baseline, Orca's worst and best case, and SARATHI by sequence length."""
from __future__ import annotations

import pandas as pd

from sarathi_lab.analysis import derive, paper
from sarathi_lab.analysis.claims import claim_row, shown, unless_missing, verdict, why_left_out
from sarathi_lab.analysis.paper_result import GpuRun, PaperResult

ORDER = ["baseline", "Orca worst", "Orca best", "SARATHI", "baseline (staggered)", "SARATHI (staggered)"]


def claims(results) -> list[dict]:
    gains = derive.orca_compare(results.summary("orca_compare"))
    # Every variant a column: one whose every run failed is NaN (not judged), not a KeyError.
    table = gains.pivot_table(index="seq_len", columns="variant", values="gain").reindex(
        columns=["SARATHI", "Orca best", "Orca worst"])
    overlap = derive.prefill_overlap(results.table("orca_compare", "iterations"))
    best_runs = gains[gains.variant == "Orca best"].run_dir
    share = overlap[overlap.run_dir.isin(best_runs)].hybrid_share.mean()
    why = why_left_out(results, "orca_compare")

    def gain(value) -> str:
        return shown(value, ".2f", why, "x")

    return [claim_row("orca_compare", "SARATHI beats Orca's best case at every sequence length",
                      "SARATHI 1.27x / 1.25x / 1.23x, Orca best 1.11x / 1.0x / 1.0x at 1K / 2K / 3K",
                      "; ".join(f"length {s:g}: SARATHI {gain(r['SARATHI'])}, Orca best {gain(r['Orca best'])}, "
                                f"worst {gain(r['Orca worst'])}" for s, r in table.iterrows())
                      + f" (Orca best: {shown(share, '.0%', why)} of prefill iterations carry decodes)",
                      verdict(unless_missing(r[["SARATHI", "Orca best"]], r["SARATHI"] > r["Orca best"])
                              for _, r in table.iterrows()))]


def _bars(runs) -> pd.DataFrame:
    summary = runs.summary("orca_compare")
    gains, variants = derive.orca_compare(summary), derive.orca_variants(summary)
    base = variants[variants.variant == "baseline"]
    # A fresh index: seaborn cannot draw a frame whose labels repeat (gains' and the summary's).
    return pd.concat([gains, base[["seq_len"]].assign(variant="baseline", gain=1.0)], ignore_index=True)


def figure(results, simulated=None):
    from sarathi_lab.analysis import figures  # here, not at the top: the registry imports without matplotlib

    colors = dict(zip(ORDER, figures.sns.color_palette("deep", len(ORDER))))
    panels = [(_bars(runs), source) for runs, source in figures.sources_of(results, simulated, "orca_compare")]
    ours = panels[0][0]
    theirs = pd.DataFrame([{"seq_len": s, "variant": v, "gain": g}
                           for v, by_len in paper.ORCA_FIG11A.items() for s, g in by_len.items()]
                          + [{"seq_len": s, "variant": "baseline", "gain": 1.0} for s in (1024, 2048, 3072)])
    fig, axes = figures.subplots(1, len(panels) + 1, figsize=(8 * len(panels) + 6, 4.5),
                                 sharey=True, width_ratios=[3] * len(panels) + [2])
    paper_ax = axes[-1]
    order = [v for v in ORDER if v in set(ours.variant)]
    for ax, (bars, title) in zip(axes, panels):
        figures.sns.barplot(bars, x="seq_len", y="gain", hue="variant", palette=colors, ax=ax, errorbar=figures.SPREAD,
                            hue_order=[v for v in ORDER if v in set(bars.variant)])
        ax.set(title=title, xlabel="sequence length (tokens)", ylabel="throughput over baseline (x)")
    figures.sns.barplot(theirs, x="seq_len", y="gain", hue="variant", palette=colors, ax=paper_ax, errorbar=None,
                        hue_order=[v for v in order if v in set(theirs.variant)], alpha=0.6)
    paper_ax.set(title="paper (13B/A6000)", xlabel="sequence length (tokens)")
    for a in axes:
        a.axhline(1, color="black", lw=1)
        # Above the bars (gains stay well under 1.5x), where the legend covers none of them.
        a.legend(fontsize=8, loc="upper center", ncol=3)
    top = max(1.6, 1.3 * max(p.get_height() for a in axes for p in a.patches))
    paper_ax.set_ylim(0, top)
    figures.headline(fig, results, "orca_compare", "Fig. 11a: baseline, Orca worst and best case, SARATHI", simulated)
    return fig


RESULT = PaperResult(
    name="orca_compare", order=60, claims=claims, figure=figure,
    reading=("**Fig. 11a, Orca.** Orca's worst case (lock step, no overlap) and best case (every later "
             "whole prefill with B - 1 decodes), run by the `orca` scheduler on two workloads (see "
             "`experiments/orca_compare.yaml`), beside SARATHI; the paper's bars on the right."),
    gpu=GpuRun(minutes=4.0, order=60,
               overrides="seq_len=1024,2048 batch_size=18 chunk=256 pd_ratio=15 workload.num_requests=54",
               dry="seq_len=48 chunk=16 pd_ratio=4 batch_size=2 workload.num_requests=4 scheduler=orca "
                   "workload.stagger=2"),
)
