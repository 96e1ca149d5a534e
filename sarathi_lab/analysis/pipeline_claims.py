"""Fig. 12 at the paper's own scale, as claims rows: the committed simulated tables of
``python -m sarathi_lab.measure sim_pipeline`` (docs/sim/pipeline_summary.csv, GPT-3 on TP8 x PP8
A100s) judged against §5.3's four ratios, beside the CPU pipeline's measured rows."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from sarathi_lab import provenance
from sarathi_lab.analysis import claims as claim_checks
from sarathi_lab.analysis.paper_results.pipeline_bubbles import CLAIM, NAME, PAPER, PAPER_TEXT
from sarathi_lab.analysis.verdict import judge

SUMMARY = Path("sim") / "pipeline_summary.csv"
# Each judged ratio: its label, the scenarios it divides, the column, the paper's figure.
RATIOS = (
    ("median bubble, Orca TP+PP / SARATHI", "orca_tp_pp", "sarathi_tp_pp", "median_bubble_s",
     "median_bubble_ratio"),
    ("all done, Orca TP+PP / SARATHI", "orca_tp_pp", "sarathi_tp_pp", "makespan_s",
     "end_to_end_ratio"),
    ("all done, TP-only / SARATHI", "orca_tp_only", "sarathi_tp_pp", "makespan_s",
     "tp_only_ratio"),
    ("all done, Orca TP+PP / TP-only", "orca_tp_pp", "orca_tp_only", "makespan_s",
     "tp_only_over_orca"),
)


def _source(summary: pd.DataFrame) -> str:
    sarathi = summary.set_index("scenario").loc["sarathi_tp_pp"]
    gpus = int(sarathi.tp) * int(sarathi.pp)
    return (f"simulated {gpus} x A100 (roofline, TP{int(sarathi.tp)} x PP{int(sarathi.pp)}), "
            f"gpt-3 (committed docs/{SUMMARY.as_posix()})")


def rows(docs: Path) -> pd.DataFrame:
    """The simulated Fig. 12 claim row; none where the table is not committed under ``docs``."""
    path = Path(docs) / SUMMARY
    if not path.is_file():
        return pd.DataFrame(columns=claim_checks.COLUMNS)
    summary = pd.read_csv(path)
    by = summary.set_index("scenario")
    points, said = [], []
    for label, over, under, column, paper in RATIOS:
        ratio = float(by.at[over, column] / by.at[under, column])
        points.append((label, judge(ratio, PAPER[paper])))
        said.append(f"{label} {ratio:.2f}x (paper {PAPER[paper]}x)")
    batches = by.batch.astype(int)
    ours = (f"{'; '.join(said)}; batch {batches.at['sarathi_tp_pp']} a micro-batch (TP+PP), "
            f"{batches.at['orca_tp_only']} a replica (TP-only), "
            f"{int(by.requests.iloc[0]):,} requests")
    row = claim_checks.judged_row(NAME, CLAIM, PAPER_TEXT, ours, points)
    recorded = provenance.recorded(path)
    row |= claim_checks.simulated_provenance(_source(summary), recorded.scale if recorded else "",
                                             "float16")
    row |= {"spread": claim_checks.NO_REPEATS, "left out": "none",
            "commit": recorded.commit if recorded and recorded.commit
            else provenance.UNRECORDED}
    row.pop("value", None)
    return pd.DataFrame([row]).reindex(columns=claim_checks.COLUMNS, fill_value="")


def owned(table: pd.DataFrame) -> pd.Series:
    """Which rows of a claims table are this module's (read from the committed tables)."""
    return (table.experiment == NAME) & table.source.str.contains(SUMMARY.as_posix(), regex=False)


def with_pipeline_claims(table: pd.DataFrame, docs: Path) -> pd.DataFrame:
    """``table`` with its simulated Fig. 12 row replaced by the committed table's, after the
    experiment's measured rows."""
    ours = rows(docs)
    kept = table[~owned(table)]
    if ours.empty:
        return kept
    last = kept.index[kept.experiment == NAME]
    at = (kept.index.get_loc(last[-1]) + 1) if len(last) else len(kept)
    joined = pd.concat([kept.iloc[:at], ours, kept.iloc[at:]], ignore_index=True)
    return joined.reindex(columns=[*table.columns, *(c for c in ours.columns
                                                      if c not in table.columns)])


def refresh(docs: Path) -> list[Path]:
    """docs/figures/claims.csv with the row replaced, where both exist."""
    path = Path(docs) / "figures" / "claims.csv"
    if not path.is_file() or not (Path(docs) / SUMMARY).is_file():
        return []
    table = with_pipeline_claims(pd.read_csv(path, keep_default_na=False), docs)
    table.to_csv(path, index=False)
    return [path]
