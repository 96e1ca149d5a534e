"""docs/figures/claims.csv is what the code gives: the full simulator at the paper's shapes, as its one
command runs it (``python -m sarathi_lab.produce --sim --publish --force``: every simulated experiment
on both cost models the table judges by, a few CPU minutes on the virtual clock), published into a copy
of docs/, then the copy's table against the committed one, every row and column but the commit.

Its simulated rows are recomputed; its measured rows are kept by a simulated publish, and its capacity
rows recomputed from the committed capacity tables (the two the runs rewrite held the same way, below),
and Fig. 12's simulated row from the committed sim_pipeline tables.
A change that moves a simulated number, a verdict or a row fails here until that command is rerun and
its output committed."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from sarathi_lab.analysis import capacity, capacity_docs
from sarathi_lab.analysis.claims import COLUMNS
from sarathi_lab.harness import REPO_ROOT

REGENERATE = "python -m sarathi_lab.produce --sim --publish --force"
KEY = ["experiment", "claim", "source"]
# Stamped by whoever reran it; every other column is the code's.
IGNORED = ["commit", capacity.COMMIT_COLUMN]


def differences(committed: pd.DataFrame, ours: pd.DataFrame, key: list[str]) -> list[str]:
    """One line per row only one side has, and per column where a row differs."""
    # Missing as '' on both sides: NaN equals nothing, itself included.
    committed, ours = (t.drop(columns=IGNORED, errors="ignore").astype(object).pipe(lambda t: t.where(t.notna(), ""))
                       .astype(str) for t in (committed, ours))
    both = committed.merge(ours, on=key, how="outer", suffixes=(" committed", " code"), indicator=True)
    lines = []
    for _, row in both.iterrows():
        name = " | ".join(str(row[k]) for k in key)
        if row["_merge"] != "both":
            lines.append(f"{name}: only in the {'committed' if row['_merge'] == 'left_only' else 'code'}'s")
            continue
        lines += [f"{name}: {column}: committed {row[f'{column} committed']!r}, code {row[f'{column} code']!r}"
                  for column in committed.columns if column not in key
                  and row[f"{column} committed"] != row[f"{column} code"]]
    if not lines and list(committed[key].itertuples(index=False)) != list(ours[key].itertuples(index=False)):
        lines.append("the same rows in another order")
    return lines


def test_a_difference_names_its_row_and_column_and_the_commit_is_no_difference():
    committed = pd.DataFrame([{"experiment": "pd_ratio", "claim": "gains", "source": "sim", "holds": "no",
                               "commit": "abc1234"}])
    assert differences(committed, committed.assign(commit="def5678"), KEY) == []
    assert differences(committed, committed.assign(holds="yes"), KEY) == [
        "pd_ratio | gains | sim: holds: committed 'no', code 'yes'"]
    assert differences(committed, committed.assign(source="sim2"), KEY) == [
        "pd_ratio | gains | sim: only in the committed's", "pd_ratio | gains | sim2: only in the code's"]
    two = pd.concat([committed, committed.assign(claim="peaks")], ignore_index=True)
    assert differences(two, two[::-1].reset_index(drop=True), KEY) == ["the same rows in another order"]


@pytest.mark.e2e
def test_the_committed_claims_table_is_what_the_code_gives(tmp_path):
    docs = tmp_path / "docs"
    for folder in ("figures", "capacity"):
        shutil.copytree(REPO_ROOT / "docs" / folder, docs / folder)
    # Fig. 12's simulated row is read from the committed sim_pipeline tables (its own command).
    (docs / "sim").mkdir()
    for name in ("pipeline_summary.csv", "provenance.json"):
        shutil.copy(REPO_ROOT / "docs" / "sim" / name, docs / "sim" / name)
    run = subprocess.run([sys.executable, "-m", "sarathi_lab.produce", "--sim", "--publish", "--force",
                          "--root", str(tmp_path / "sim"), "--docs", str(docs)],
                         cwd=REPO_ROOT, env=os.environ | {"MPLBACKEND": "Agg"}, capture_output=True, text=True,
                         timeout=3600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "sim-roofline").is_dir()
    # Every simulated experiment ran: no committed simulated row was kept for want of a run.
    assert "simulated rows kept as committed" not in run.stdout, run.stdout[-2000:]

    tables = [pd.read_csv(d / "figures" / "claims.csv", keep_default_na=False) for d in (REPO_ROOT / "docs", docs)]
    assert list(tables[0].columns) == COLUMNS, f"columns not in the order {REGENERATE} writes them"
    found = differences(*tables, KEY)
    assert not found, (f"docs/figures/claims.csv differs from what the code gives ({REGENERATE} rewrites it):\n"
                       + "\n".join(found))
    for name in capacity_docs.SIM_TABLES.values():
        committed, ours = (capacity_docs.read_table(d / "capacity" / name) for d in (REPO_ROOT / "docs", docs))
        found = differences(committed, ours, ["scheduler", "tbt_slo_s"])
        assert not found, f"docs/capacity/{name} differs from the code's ({REGENERATE}):\n" + "\n".join(found)
