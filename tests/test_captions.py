"""A figure's caption (analysis/captions.py): every claim a source does not hold, with why its numbers
depart from the paper's; none where every claim holds."""
from __future__ import annotations

import pandas as pd

from sarathi_lab.analysis.captions import caption
from sarathi_lab.analysis.claims import COLUMNS, DIFFERS, simulated_provenance


def _row(holds: str, source: str, scale: str = "full", **more) -> dict:
    base = dict.fromkeys(COLUMNS, "") | {"experiment": "pd_ratio", "claim": "gains 10%+", "paper": "1.27x",
                                         "ours": "peak 1.05x", "holds": holds, "scale": scale}
    if source.startswith("simulated"):
        return base | simulated_provenance(source, scale, "bfloat16") | more
    return base | {"source": source, "dtype": "float32", "machine": "Test CPU"} | more


def test_each_claim_not_held_is_named_with_why_and_a_held_one_is_not():
    table = pd.DataFrame([
        _row("yes", "simulated A6000 (roofline), llama-13b"),
        _row("no", "measured CPU, cpu-small"),
        _row("partly", "simulated A6000 (calibrated), llama-13b", **{DIFFERS: "calibrated: partly; roofline: yes"}),
        _row("no", "simulated A6000 (calibrated), llama-13b", scale="ci"),
        _row("no", "measured CPU, cpu-small") | {"experiment": "orca_compare"},
    ])
    lines = caption(table, "pd_ratio").splitlines()
    assert lines[0] == "**Where this figure disagrees with the paper:**" and len(lines) == 4
    assert lines[1].startswith("- *measured CPU, cpu-small* (full scale): gains 10%+: **no**; ours peak 1.05x; "
                               "paper 1.27x. Why: measured on Test CPU in float32, not on the paper's GPU")
    assert "a cost model's prediction at the paper's shape" in lines[2]
    assert lines[2].endswith("; calibrated: partly; roofline: yes.")
    assert "Why: the quick CI scale, not the paper's" in lines[3] and "python -m sarathi_lab.produce --sim" in lines[3]
    assert caption(table[table.holds == "yes"], "pd_ratio") == ""
