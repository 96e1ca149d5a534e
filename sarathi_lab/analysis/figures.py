"""What every paper figure shares: style, headline and sources."""
from __future__ import annotations

import io
import numbers
from pathlib import Path

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import seaborn as sns

sns.set_theme(style="whitegrid", context="notebook")
PAPER_STYLE = {"marker": "*", "s": 180, "color": "black", "zorder": 5}
# Simulated series: dashed, square markers, in reds.
SIM_STYLE = {"ls": "--", "marker": "s", "markersize": 5}
# Seeds drawn as their full range: a bootstrapped 95% interval over two or three is noise.
SPREAD = ("pi", 100)


def sim_colors(n: int) -> list:
    return sns.color_palette("Reds_r", n + 1)[:n]


def simulated_label(simulated, name: str) -> str | None:
    """None when ``simulated`` has no run of ``name``."""
    if simulated is None or name in simulated.missing():
        return None
    return simulated.source(name)


def headline(fig, results, name: str, text: str, simulated=None, why=()) -> None:
    """Above the figure ``text`` and the runs drawn; under it ``why`` it departs from the paper."""
    seeds = len(results.seeds(name))
    spread = (f"; mean of {seeds} seeds, bands and whiskers (where drawn): min-max"
              if seeds > 1 else "")
    lines = [text, results.describe(name) + spread]
    lines += [simulated.describe(name)] if simulated_label(simulated, name) else []
    fig.suptitle("\n".join(lines), fontsize=11)
    if any(why):
        fig.text(0.5, -0.02, " ".join(filter(None, why)), ha="center", va="top", fontsize=9,
                 wrap=True, style="italic")


def source_label(runs, name: str) -> str:
    """e.g. 'measured CPU, ci scale' or 'simulated A6000 (roofline), full scale'."""
    return f"{runs.source(name)}, {runs.scale(name)} scale"


def sources_of(results, simulated, name: str) -> list[tuple]:
    """(runs, panel label) of the measured runs and, where they hold ``name``, the simulated."""
    return [(runs, source_label(runs, name)) for runs in (results, simulated)
            if runs is results or simulated_label(simulated, name)]


def panel_sources(results, simulated, name: str) -> str:
    return "; dashed: ".join(label for _, label in sources_of(results, simulated, name))


def fold_group_headers(ax, frame, prefixes: dict[str, str]) -> None:
    """Drops seaborn's group headers, prefixing each level ('64' -> 'C=64'); before the legend."""
    def levels(column: str) -> set[str]:
        values = frame[column].dropna().unique()
        return {str(v) for v in values} | {f"{v:g}" for v in values if isinstance(v, numbers.Real)}

    handles, labels = ax.get_legend_handles_labels()
    under = None
    for handle, label in zip(handles, labels):
        if label in prefixes:
            under = label
            # an underscore keeps it out of legends
            handle.set_label(f"_{label}")
        elif under is not None and label in levels(under):
            handle.set_label(f"{prefixes[under]}{label}")
        else:
            under = None


def legend_outside(ax, **kwargs) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0, **kwargs)


def plain_log_ticks(axis) -> None:
    """Plain numbers at 1, 2 and 5 of each decade: "6 x 10^-2" at every minor tick overprints."""
    axis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"
                                                   if f"{v:g}".lstrip("0.")[:1] in ("2", "5")
                                                   else ""))


def png(fig) -> bytes:
    """Small enough to keep in the repository's docs."""
    data = io.BytesIO()
    fig.savefig(data, format="png", dpi=90, bbox_inches="tight")
    return data.getvalue()


def save(fig, root: str | Path, name: str) -> Path:
    path = Path(root) / "figures" / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png(fig))
    return path


def subplots(*args, **kwargs):
    """Constrained layout makes room for the headline and outside legends."""
    return plt.subplots(*args, layout="constrained", **kwargs)
