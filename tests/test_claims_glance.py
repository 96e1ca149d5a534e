"""RESULTS.md's claims-at-a-glance table is what the code writes from the committed claims table."""
from pathlib import Path

import pandas as pd

from sarathi_lab.analysis import claims_glance

DOCS = Path(__file__).parents[1] / "docs"


def test_results_md_glance_is_what_publish_writes_from_the_committed_claims():
    text = (DOCS / "RESULTS.md").read_text()
    start = text.index(claims_glance.BEGIN)
    end = text.index(claims_glance.END) + len(claims_glance.END)
    assert text[start:end] == claims_glance.section(DOCS / "figures" / "claims.csv"), (
        "docs/RESULTS.md's glance differs from docs/figures/claims.csv: "
        "python -m sarathi_lab.measure publish rewrites it")


def test_each_claim_is_one_row_with_each_kind_of_source_in_its_column(tmp_path):
    rows = [
        {"experiment": "x", "claim": "c|1", "paper": "2x", "source": "measured CPU, tiny", "ours": "1.9x",
         "ours / paper": "yes (0.9x)", "holds": "yes"},
        {"experiment": "x", "claim": "c|1", "paper": "2x", "source": "simulated A6000 (calibrated), 13b",
         "ours": "5x", "ours / paper": "larger (4x)", "holds": "larger"},
        {"experiment": "x", "claim": "c|1", "paper": "2x", "source": "simulated A100 (calibrated), 7b",
         "ours": "1.5x", "ours / paper": "", "holds": "smaller"},
    ]
    frame = pd.DataFrame(rows).assign(scale="full", dtype="", threads="", machine="", commit="abc")
    table = claims_glance.table(frame).splitlines()
    assert len(table) == 3  # header, rule, one claim
    cells = table[2].split(" | ")
    assert cells[1] == "c\\|1" and cells[3] == "yes (0.9x)" and cells[4] == "yes"
    # Two calibrated sources: each named; no magnitude: what it measured.
    assert cells[5] == ("simulated A6000 (calibrated), 13b: larger (4x)<br>"
                        "simulated A100 (calibrated), 7b: 1.5x")
    assert cells[6] == "larger<br>smaller" and cells[7:] == ["", " |"]
    frame.to_csv(tmp_path / "claims.csv", index=False)
    md = tmp_path / "RESULTS.md"
    md.write_text(f"head\n{claims_glance.BEGIN}\nSTALE\n{claims_glance.END}\ntail\n")
    claims_glance.write(md, tmp_path / "claims.csv")
    written = md.read_text()
    assert written.startswith("head\n") and written.endswith("tail\n") and "STALE" not in written
    assert "- **measured on a CPU**: source measured CPU, tiny; scale full; commit abc." in written
