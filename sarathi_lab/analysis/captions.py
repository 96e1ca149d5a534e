"""A figure's caption from the claims table: each claim a source does not hold, and why its numbers
depart from the paper's (where they were made, and the result's own reason where it gives one)."""
from __future__ import annotations

import pandas as pd

from sarathi_lab.analysis.claims import DIFFERS

# The verdicts that need no caption: the claim holds, or these runs do not judge it; every other
# one (no, partly, unclear) disagrees with the paper in whole or in part, or cannot tell.
AGREE = ("yes", "n/a")
SIMULATED = "simulated"


def reason(row) -> str:
    """Why a row's numbers may depart from the paper's, from where and at what scale they came."""
    simulated = str(row["source"]).startswith(SIMULATED)
    if row["scale"] == "ci":
        return ("the quick CI scale, not the paper's: a tiny model at a few points, which checks "
                "the pipeline" + (", not the paper's shapes (python -m sarathi_lab.produce --sim "
                                  "runs those, in seconds)" if simulated else ""))
    if simulated:
        differs = f"; {row[DIFFERS]}" if str(row.get(DIFFERS, "")) else ""
        return ("a cost model's prediction at the paper's shape: its kernels' times, not a GPU's "
                "(the figure's own reason, where it has one, is under it; docs/RESULTS.md holds "
                f"the same claim measured on GPUs){differs}")
    return (f"measured on {row['machine'] or 'a CPU'} in {row['dtype']}, not on the paper's GPU, "
            "whose flops per byte read set where its effects appear (\"Why a CPU differs\", below)")


def caption(table: pd.DataFrame, name: str) -> str:
    """Markdown: '' where every claim of ``name`` holds (or none was judged)."""
    rows = table[(table.experiment == name) & ~table.holds.isin(AGREE)]
    if rows.empty:
        return ""
    lines = [f"- *{row['source']}* ({row['scale']} scale): {row['claim']}: **{row['holds']}**; "
             f"ours {row['ours']}; paper {row['paper']}. Why: {reason(row)}."
             for _, row in rows.iterrows()]
    return "**Where this figure disagrees with the paper:**\n" + "\n".join(lines)
