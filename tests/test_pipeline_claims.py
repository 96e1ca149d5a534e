"""Fig. 12's simulated claims row comes from the committed sim_pipeline tables, judged on each of
§5.3's four ratios, and publish places it after the experiment's measured rows."""
from __future__ import annotations

import pandas as pd

from sarathi_lab import provenance
from sarathi_lab.analysis import claims, pipeline_claims
from sarathi_lab.analysis.paper_results.pipeline_bubbles import PAPER

HEADER = "scenario,scheduler,tp,pp,replicas,batch,requests,makespan_s,median_bubble_s\n"


def _docs(tmp_path, orca_bubble=26.0, sarathi_bubble=2.0):
    (tmp_path / "sim").mkdir(parents=True)
    path = tmp_path / "sim" / "pipeline_summary.csv"
    path.write_text(HEADER + f"orca_tp_pp,orca,8,8,1,27,10000,3000,{orca_bubble}\n"
                    f"sarathi_tp_pp,sarathi,8,8,1,27,10000,1000,{sarathi_bubble}\n"
                    "orca_tp_only,orca,8,1,8,11,10000,1500,0.3\n")
    provenance.record({path: provenance.Provenance("simulated A100 (pipeline)", "10000 requests",
                                                   commit="abc1234")})
    return tmp_path


def test_each_ratio_is_judged_against_the_paper_s_and_the_row_says_where_it_came_from(tmp_path):
    row = pipeline_claims.rows(_docs(tmp_path)).iloc[0]
    # 26 / 2 = 13x against 6.29x: effect 12 over 5.29, past 2x: larger.
    assert "median bubble, Orca TP+PP / SARATHI: larger" in row["ours / paper"]
    assert "all done, Orca TP+PP / SARATHI 3.00x (paper 1.91x)" in row.ours
    assert "all done, TP-only / SARATHI: yes" in row["ours / paper"]  # 1.5 against 1.48
    assert (row.commit, row.scale, row.machine) == ("abc1234", "10000 requests",
                                                    "none: predicted by the cost model")
    assert row.source.startswith("simulated 64 x A100 (roofline, TP8 x PP8), gpt-3")
    assert list(pipeline_claims.rows(_docs(tmp_path / "b", 6.0, 1.0)).columns) == claims.COLUMNS


def test_the_paper_s_own_ratio_reads_yes(tmp_path):
    docs = _docs(tmp_path, orca_bubble=PAPER["median_bubble_ratio"], sarathi_bubble=1.0)
    assert "median bubble, Orca TP+PP / SARATHI: yes (1x)" in pipeline_claims.rows(docs).iloc[0][
        "ours / paper"]


def test_publish_replaces_the_row_after_the_measured_ones_and_keeps_the_rest(tmp_path):
    docs = _docs(tmp_path)
    measured = {"experiment": "pipeline_bubbles", "claim": "c", "source": "measured CPU, cpu-small"}
    stale = {"experiment": "pipeline_bubbles", "claim": pipeline_claims.CLAIM,
             "source": "simulated 64 x A100 (roofline, TP8 x PP8), gpt-3 (committed "
                       "docs/sim/pipeline_summary.csv)", "ours": "stale"}
    table = pd.DataFrame([{"experiment": "pd_ratio", "claim": "p"}, stale, measured,
                          {"experiment": "capacity", "claim": "k"}]).reindex(
        columns=claims.COLUMNS, fill_value="")
    out = pipeline_claims.with_pipeline_claims(table, docs)
    assert list(out.experiment) == ["pd_ratio", "pipeline_bubbles", "pipeline_bubbles", "capacity"]
    assert out.source.iloc[1] == "measured CPU, cpu-small" and "stale" not in set(out.ours)
    assert (out.iloc[2].claim, out.iloc[2].commit) == (pipeline_claims.CLAIM, "abc1234")


def test_without_the_committed_table_no_row_is_made(tmp_path):
    assert pipeline_claims.rows(tmp_path).empty
    assert pipeline_claims.refresh(tmp_path) == []


def test_a_publish_whose_docs_lack_the_committed_table_keeps_the_committed_row():
    from sarathi_lab.analysis.publish import PREDICTED, claims_rows
    fig12 = {"experiment": "pipeline_bubbles", "claim": pipeline_claims.CLAIM, "machine": PREDICTED,
             "source": "simulated 64 x A100 (roofline, TP8 x PP8), gpt-3 (committed "
                       "docs/sim/pipeline_summary.csv)", "ours": "committed"}
    committed = pd.DataFrame([fig12]).reindex(columns=claims.COLUMNS, fill_value="")
    # Neither a measured nor a simulated root makes it: only its committed tables do.
    assert list(claims_rows(None, [], committed).ours) == ["committed"]
