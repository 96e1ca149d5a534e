"""Fig. 13c's P:D sensitivity table (python -m sarathi_lab.measure sim_chunk_pd): each claim's headline
at the verdict's P:D, at its chunk's own C / (B - 1) and at its best, on hand-made summaries whose answers
are known; the committed table held to what the simulator gives at 1K (its writer's refusals:
test_sim_chunk_align.py, which runs both tables' commands)."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from sarathi_lab.analysis.runs import Results
from sarathi_lab.measure.sim_check import sensitivity, sim_chunk_pd
from sarathi_lab.measure.sim_check.sensitivity import Sweep
from tests.results_frames import Frames

# At 1K (B = 18, the verdict's P:D 15): chunk 64 gains more with the more decodes a lower P:D brings.
GAINS = {  # (chunk, recorded alignment) -> {P:D: gain}
    (64, "none"): {4: 0.9, 8: 0.7, 15: 0.5},
    (128, "tile"): {4: 0.95, 8: 1.02, 15: 0.85},
    (128, "none"): {4: 0.5, 8: 0.5, 15: 0.5},  # not the run the claim reads
    (256, "tile"): {4: 1.0, 8: 1.05, 15: 1.2},
    (320, "none"): {4: 1.0, 8: 1.0, 15: 1.1},
    (320, "tile"): {4: 9.0, 8: 9.0, 15: 9.0},  # 256's aligned chunk: the claim reads 320 fixed
}


def _summary() -> pd.DataFrame:
    rows = []
    for ratio in (4, 8, 15):
        keys = {"seq_len": 1024, "batch_size": 18, "pd_ratio": ratio}
        rows.append(keys | {"scheduler": "static", "chunk": 256, "total_throughput_tok_s": 100.0})
        rows += [keys | {"scheduler": "sarathi", "chunk": chunk, "chunk_align": align,
                         "total_throughput_tok_s": 100.0 * by_pd[ratio]}
                 for (chunk, align), by_pd in GAINS.items()]
    return pd.DataFrame(rows)


def test_each_headline_at_the_verdicts_pd_at_its_chunks_own_and_at_its_best():
    table = sim_chunk_pd.table(Frames({("chunk_batch", "summary"): _summary()}), verdicts={1024: 15})
    by = table.set_index("headline")
    small = by.loc["chunk 64 over the baseline (x)"]
    assert (small.verdict_pd, small.own_pd, small.best_pd) == (15, 4, 4)  # own: round(64 / 17)
    assert (small.at_verdict_pd, small.at_own_pd, small.moves) == pytest.approx((0.5, 0.9, 0.4))
    assert small.paper == 1.0
    mid = by.loc["chunk 128 over the baseline (x)"]  # the tile-aligned run, as the claim reads it
    assert (mid.own_pd, mid.at_own_pd, mid.best_pd, mid.at_best_pd) == pytest.approx((8, 1.02, 8, 1.02))
    order = by.loc["chunk 256 over chunk 320 (x)"]  # 320 fixed; at 320's own P:D, round(320 / 17)
    assert order.own_pd == 19 and pd.isna(order.at_own_pd) and pd.isna(order.moves)
    assert (order.at_verdict_pd, order.best_pd) == pytest.approx((1.2 / 1.1, 15))
    assert pd.isna(order.paper)  # the paper gives the order, not a size


def test_a_length_whose_verdict_pd_did_not_run_has_no_row():
    assert sim_chunk_pd.table(Frames({("chunk_batch", "summary"): _summary()}), verdicts={1024: 14}).empty


def test_the_sweep_runs_every_chunks_own_pd_at_every_setup():
    (sweep,) = sim_chunk_pd.sweeps()
    grid = dict(o.split("=", 1) for o in sweep.grid)
    ratios = {float(r) for r in grid["pd_ratio"].split(",")}
    verdicts = sim_chunk_pd.verdict_pd()
    assert verdicts == {1024: 15, 2048: 28, 3072: 51}  # the setups' own, 256 / (B - 1)
    for length, size in ((1024, 18), (2048, 10), (3072, 6)):
        assert {verdicts[length], *(sim_chunk_pd.own_pd(c, size) for c in sim_chunk_pd.CHUNKS)} <= ratios
    assert grid["chunk"] == "64,128,256,320"


@pytest.mark.e2e
def test_the_committed_table_is_what_the_simulator_gives_at_1k(tmp_path):
    committed = pd.read_csv(sim_chunk_pd.TABLE.out)
    committed = committed[committed.seq_len == 1024].set_index("headline")
    ratios = sorted({15, *(sim_chunk_pd.own_pd(c, 18) for c in sim_chunk_pd.CHUNKS)})
    sensitivity.run_sweeps([Sweep("chunk_batch", "ci", grid=(
        "setup=a6000_13b_1k", "chunk=64,128,256,320", f"pd_ratio={','.join(map(str, ratios))}"))], tmp_path)
    found = sim_chunk_pd.table(Results(tmp_path)).set_index("headline")
    columns = ["verdict_pd", "at_verdict_pd", "own_pd", "at_own_pd"]  # the best reads P:D's not run here
    assert list(found.index) == list(committed.index)
    pd.testing.assert_frame_equal(found[columns], committed[columns], rtol=1e-3, check_dtype=False)
    # Through the command, from those runs: the table says the commit they ran at.
    sim_chunk_pd.main(["--runs", str(tmp_path), "--out", str(tmp_path / "table.csv")])
    made = json.loads((tmp_path / "provenance.json").read_text())["table.csv"]
    assert (made["source"], made["commit"]) == ("simulated A6000 (calibrated)", sensitivity.planned_commit())
    assert made["commit"] not in ("", "unrecorded")

