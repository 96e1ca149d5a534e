"""RESULTS.md's numbers are written by code: each generated block is what the committed tables give,
and a stale block is replaced whole."""
from pathlib import Path

import pandas as pd
import pytest

from sarathi_lab.analysis import claims, results_page

DOCS = Path(__file__).parents[1] / "docs"


def test_every_generated_block_of_results_md_is_what_publish_writes_now():
    text = (DOCS / "RESULTS.md").read_text()
    assert len(results_page.BLOCK.findall(text)) >= 10  # every experiment and capacity table
    assert results_page.rewritten(text, DOCS) == text, (
        "a generated block of docs/RESULTS.md differs from the committed tables: "
        "python -m sarathi_lab.measure publish rewrites it")


def test_the_page_quotes_every_experiment_of_the_claims_table():
    text = (DOCS / "RESULTS.md").read_text()
    named = {m[2] for m in results_page.BLOCK.findall(text) if m[1] == "claims"}
    table = pd.read_csv(DOCS / "figures" / "claims.csv", keep_default_na=False)
    assert set(table.experiment) - {"capacity"} <= named


def _docs(tmp_path: Path) -> Path:
    (tmp_path / "figures").mkdir()
    (tmp_path / "capacity").mkdir()
    pd.DataFrame([{"experiment": "x", "claim": "c", "source": "measured CPU, tiny", "ours": "1.9x",
                   "holds": "yes", "scale": "full", "machine": "Test CPU", "commit": "abc1234"}]
                 ).reindex(columns=claims.COLUMNS, fill_value="").to_csv(
        tmp_path / "figures" / "claims.csv", index=False)
    pd.DataFrame([{"scheduler": s, "tbt_slo_s": slo, "capacity_rps": rps, "binding": "tbt_p99_s",
                   "resolution": 0.05, "token_budget": 512 if s == "sarathi_serve" else None,
                   "model": "m", "scale": "full", "sim_device": "a100", "sim_cost_model": "roofline",
                   "sim_tp": 1, "git_commit": "abcdef0123"}
                  for s, rps in (("sarathi_serve", 4.0), ("vllm", 1.6)) for slo in (0.1, 0.5)]
                 ).to_csv(tmp_path / "capacity" / "t.csv", index=False)
    return tmp_path


def test_a_stale_block_is_replaced_and_the_prose_around_it_kept(tmp_path):
    docs = _docs(tmp_path)
    text = ("intro\n<!-- generated: claims x -->\nSTALE 9.9x\n<!-- /generated -->\nwhy\n"
            "<!-- generated: capacity t.csv -->\n<!-- /generated -->\nend\n")
    out = results_page.rewritten(text, docs)
    assert "STALE" not in out and out.startswith("intro\n") and out.endswith("end\n")
    assert "| c | measured CPU, tiny | 1.9x |  | **yes** | full, Test CPU, abc1234 |" in out
    assert "| sarathi_serve | 4; P99 TBT; budget 512 | 4; P99 TBT; budget 512 |" in out
    assert "| sarathi_serve / vllm | **2.50x** | **2.50x** |" in out
    assert "simulated 1 x A100 (roofline), m; scale full; search resolution 5%; commit abcdef0" in out
    assert results_page.rewritten(out, docs) == out


def test_an_unknown_kind_of_block_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match="kind 'plot' is invalid; allowed: claims, capacity"):
        results_page.rewritten("<!-- generated: plot x -->\n<!-- /generated -->\n", _docs(tmp_path))
