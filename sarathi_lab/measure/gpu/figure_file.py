"""Where the suite's figures go: <out>/figures/<name>.png."""
from __future__ import annotations

from pathlib import Path


def save(fig, out: Path, name: str) -> None:
    path = out / "figures" / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    # as analysis.figures.save, without its seaborn theme
    fig.savefig(path, dpi=90, bbox_inches="tight")
    pyplot().close(fig)


def pyplot():
    """matplotlib's pyplot off-screen, imported where a figure is drawn (not by ``--plan``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
