"""A sweep's report with its figures: the paper's figure where the sweep is a paper experiment's,
and its headline metrics against what it swept; saved beside sweep_summary.csv and logged with it
to W&B (harness/sweep.py writes the table; conf/config.yaml names this class as the callback)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sarathi_lab.harness.results import SWEEP_TABLE
from sarathi_lab.harness.sweep import HEADLINE, TRUST, SweepSummary

if TYPE_CHECKING:
    import pandas as pd

# The sweep's own figure: its headline metrics against the swept keys, one panel each.
SWEPT_FIGURE = Path(SWEEP_TABLE).with_suffix(".png").name
PANELS = ("ttft_p50_s", "itl_p99_s", "e2el_p50_s", "total_throughput_tok_s")


class SweepReport(SweepSummary):
    def figures(self, name: str, sweep_dir: Path, table: pd.DataFrame) -> dict[str, Path]:
        from sarathi_lab.analysis import figures, registry
        from sarathi_lab.analysis.runs import Results

        drawn = {}
        if name in registry.names():
            fig = registry.draw(registry.by_name(name), Results.of_sweep(sweep_dir, name))
            if fig is not None:
                drawn[name] = _save(fig, sweep_dir / f"{name}.png")
        if (fig := swept_figure(table)) is not None:
            drawn["sweep_summary"] = _save(fig, sweep_dir / SWEPT_FIGURE)
        figures.plt.close("all")
        return drawn


def swept_columns(table: pd.DataFrame) -> list[str]:
    """The keys the sweep varied, as sweep_table lays them out (between status and TRUST)."""
    return [c for c in table.columns if c not in ("job", "status", *TRUST, *HEADLINE)]


def swept_figure(table: pd.DataFrame):
    """Each headline metric against the swept key of most values, a line per value of the next;
    None where nothing was swept or no job measured."""
    import pandas as pd

    from sarathi_lab.analysis import figures

    swept = swept_columns(table)
    panels = [m for m in PANELS if m in table and table[m].notna().any()]
    if not swept or not panels:
        return None
    frame = table.copy()
    for column in swept:
        numbers = pd.to_numeric(frame[column], errors="coerce")
        frame[column] = numbers if numbers.notna().all() else frame[column].astype(str)
    x = max(swept, key=lambda c: (frame[c].nunique(), pd.api.types.is_numeric_dtype(frame[c])))
    others = [c for c in swept if c != x]
    if others:
        frame["series"] = frame[others].astype(str).agg(
            lambda row: ", ".join(f"{k}={v}" for k, v in zip(others, row)), axis=1)
    fig, axes = figures.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    for ax, metric in zip(axes[0], panels):
        figures.sns.lineplot(frame, x=x, y=metric, hue="series" if others else None,
                             marker="o", ax=ax, legend=ax is axes[0][-1] and bool(others))
        ax.set(title=metric, ylabel=metric)
    if others:
        figures.legend_outside(axes[0][-1], fontsize=7)
    sources = ", ".join(str(s) for s in frame.get("source", pd.Series(dtype=str)).dropna().unique())
    unreliable = int(frame.get("timing_unreliable", pd.Series(dtype=bool)).eq(True).sum())
    note = f"; {unreliable} of {len(frame)} runs timing-unreliable" if unreliable else ""
    fig.suptitle(f"sweep of {', '.join(swept)}: {sources or 'no source recorded'}{note}",
                 fontsize=10)
    return fig


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=90, bbox_inches="tight")
    return path
