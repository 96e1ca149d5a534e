"""The suite's figures and claims from the finished steps; what runs cannot give yet is a note."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pandas as pd

from sarathi_lab.measure.gpu import steps
from sarathi_lab.measure.gpu.figure_file import save
from sarathi_lab.measure.gpu.steps.env import ceilings


def paper_report(out: Path, dry_run: bool = False) -> list[str]:
    """Each experiment's figure and claims from <out>/paper; a dry run keeps runs that waited."""
    from sarathi_lab.analysis import claims, registry
    from sarathi_lab.analysis.runs import Results

    root = out / "paper"
    if not root.is_dir():
        return []
    results, notes, rows = Results(root, include_unreliable=dry_run), [], []
    for result in registry.RESULTS:
        name = result.name
        if not (root / name).is_dir():
            continue
        try:
            rows += claims.rows_of(result.claims, results, name)
            fig = registry.draw(result, results)
            if fig is None:
                notes.append(f"{name}: no figure: {results.unreliable_note(name)}")
                continue
            save(fig, out, name)
        except Exception as e:  # noqa: BLE001 (a figure or claim the runs at hand cannot give)
            plt.close("all")
            notes.append(f"{name}: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}"[:200])
    if rows:
        table = pd.DataFrame(rows, columns=claims.COLUMNS)
        table.to_csv(out / "claims.csv", index=False)
        (out / "claims.md").write_text(claims_markdown(table, out))
    return notes


def _cell(value) -> str:
    return "" if pd.isna(value) else str(value).replace("|", "\\|").replace("\n", " ")


def claims_markdown(table: pd.DataFrame, out: Path) -> str:
    """claims.csv as a markdown table (the columns any row fills), then the folder's figures."""
    device = (ceilings(out) or {}).get("device", "the device the env step has not named yet")
    columns = [c for c in table.columns if table[c].map(_cell).ne("").any()]
    lines = [f"# The paper's claims, measured on {device}", "",
             ("From the runs under `paper/` (`python -m "
              "sarathi_lab.measure gpu`); the same rows as `claims.csv`."), "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row[c]) for c in columns) + " |"
              for _, row in table.iterrows()]
    figures = sorted((out / "figures").glob("*.png"))
    lines += ["", "## Figures", ""] + [f"![{p.stem}](figures/{p.name})" for p in figures]
    return "\n".join(lines) + "\n"


def write_report(out: Path, dry_run: bool = False) -> list[str]:
    """Each step module's figure (its STEP's), then the paper's; a note for each not drawn."""
    notes = [f"{d.figure_name}: nothing to draw yet" for d in steps.declared().values()
             if d.figure is not None and not d.figure(out)]
    return notes + paper_report(out, dry_run)
