"""The one parity panel of the simulator's checks: each point's prediction against its measurement
(point_table's columns), in ms on log axes, beside the line where the two are equal."""
from __future__ import annotations

import pandas as pd

from sarathi_lab.measure.sim_check.point_table import MEASURED, PREDICTED


def draw(ax, points: pd.DataFrame, title: str, colour_by: str, colours: dict | None = None,
         marker_by: str | None = None, markers: dict | None = None, flagged: str | None = None,
         flag_label: str = "", what: str = "iteration") -> None:
    """A colour per value of ``colour_by`` (``colours``, else the axes' cycle in order of
    appearance) and, with ``marker_by``, a marker per value in ``markers`` (others not drawn);
    points whose ``flagged`` column is true are crosses, ``flag_label`` in the legend."""
    from sarathi_lab.analysis.figures import plain_log_ticks

    values = list(dict.fromkeys(points[colour_by]))
    colour = {v: (colours or {}).get(v, f"C{i}") for i, v in enumerate(values)}
    flag = points[flagged].astype(bool) if flagged else pd.Series(False, index=points.index)
    shapes = markers if marker_by else {None: "o"}
    for value in values:
        group = points[points[colour_by] == value]
        for kind, marker in shapes.items():
            each = group[~flag[group.index] & ((group[marker_by] == kind) if marker_by else True)]
            ax.scatter(each[MEASURED] * 1e3, each[PREDICTED] * 1e3, s=6, marker=marker,
                       alpha=0.5, color=colour[value], rasterized=True)
        crossed = group[flag[group.index]]
        ax.scatter(crossed[MEASURED] * 1e3, crossed[PREDICTED] * 1e3, s=30, marker="x",
                   color=colour[value])
    low = min(points[MEASURED].min(), points[PREDICTED].min()) * 1e3
    high = max(points[MEASURED].max(), points[PREDICTED].max()) * 1e3
    ax.plot([low, high], [low, high], "k-", lw=0.8, label="simulated = measured")
    ax.set(xscale="log", yscale="log", xlabel=f"measured {what} (ms)",
           ylabel=f"simulated {what} (ms)", title=title)
    plain_log_ticks(ax.xaxis)
    plain_log_ticks(ax.yaxis)
    for value in values:
        ax.scatter([], [], s=15, color=colour[value], label=value)
    for kind, marker in (markers.items() if marker_by else ()):
        ax.scatter([], [], s=15, marker=marker, color="0.4", label=kind)
    if flag.any():
        ax.scatter([], [], s=15, marker="x", color="k", label=flag_label)
    ax.legend(fontsize=7)
