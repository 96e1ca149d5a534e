"""RESULTS.md's "every claim at a glance": the committed claims table, a row per claim, a column
pair per kind of source (measured on a CPU, simulated calibrated, simulated roofline), so that the
page says what the code wrote and nothing a hand kept."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

BEGIN = ("<!-- claims-glance: written by python -m sarathi_lab.measure publish from "
         "docs/figures/claims.csv; edits here are replaced -->")
END = "<!-- /claims-glance -->"

# A source's column, by what its claims-table source says.
KINDS = {"measured": "measured on a CPU", "calibrated": "simulated, calibrated",
         "roofline": "simulated, roofline"}


def kind_of(source: str) -> str | None:
    if source.startswith("measured"):
        return "measured"
    for kind in ("calibrated", "roofline"):
        if f"({kind}" in source:
            return kind
    return None


def cell(text) -> str:
    text = "" if pd.isna(text) else str(text)
    return text.replace("|", "\\|").replace("\n", " ")


def _said(row: pd.Series) -> str:
    """A row's magnitude against the paper where it has one, else what it measured."""
    versus = row.get("ours / paper")
    return cell(versus if isinstance(versus, str) and versus else row["ours"])


def _provenance(rows: pd.DataFrame) -> str:
    """Each kind's sources, scales, machines and commits, once under the table."""
    lines = []
    for kind, title in KINDS.items():
        part = rows[rows.source.map(kind_of) == kind]
        if part.empty:
            continue
        said = []
        for key in ("source", "scale", "dtype", "threads", "machine", "commit"):
            values = [v for v in dict.fromkeys(part[key].astype(str)) if v not in ("", "nan")]
            if values:
                said.append(f"{key} {' / '.join(values)}")
        lines.append(f"- **{title}**: {'; '.join(said)}.")
    return "\n".join(lines)


def table(claims: pd.DataFrame) -> str:
    """The glance table's markdown: one row per (experiment, claim), in the claims table's order."""
    claims = claims.assign(kind=claims.source.map(kind_of))
    header = ["experiment", "claim", "paper"]
    for title in KINDS.values():
        header += [f"{title}: ours / paper", "holds?"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (experiment, claim), rows in claims.groupby(["experiment", "claim"], sort=False):
        cells = [experiment, cell(claim), cell(rows.paper.iloc[0])]
        for kind in KINDS:
            part = rows[rows.kind == kind]
            if part.empty:
                cells += ["", ""]
                continue
            # Several sources of one kind (another device or trace): each named.
            many = len(part) > 1
            cells.append("<br>".join((f"{cell(r.source)}: " if many else "") + _said(r)
                                     for _, r in part.iterrows()))
            cells.append("<br>".join(cell(r.holds) for _, r in part.iterrows()))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def section(claims_csv: Path) -> str:
    claims = pd.read_csv(claims_csv, keep_default_na=False)
    return "\n".join([BEGIN, "", table(claims), "", "Where each column's numbers come from:", "",
                      _provenance(claims), "", END])


def write(results_md: Path, claims_csv: Path) -> Path:
    """Rewrites ``results_md`` between BEGIN and END (placed by hand once; ValueError without)."""
    text = results_md.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{results_md} is invalid: it has no section between {BEGIN!r} and "
                         f"{END!r} to rewrite")
    results_md.write_text(text[:start] + section(claims_csv) + text[end + len(END):])
    return results_md
