"""The chunk-alignment sensitivity table (python -m sarathi_lab.measure sim_chunk_align): each headline
with the fixed and the tile-aligned chunk, on hand-made summaries whose answers are known; and its
writer refusing, before any sweep runs, a table another command wrote."""
from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from sarathi_lab.measure.sim_check import sim_chunk_align
from tests.results_frames import Frames


def _pd_ratio() -> pd.DataFrame:
    # Chunk 256, B = 18 at 1K: fixed peaks at P:D 10 (1.01x), aligned at 14 (1.15x).
    gains = {("none", 10): 1.01, ("none", 14): 1.0, ("tile", 10): 1.10, ("tile", 14): 1.15}
    rows = []
    for (align, ratio), gain in gains.items():
        keys = {"seq_len": 1024, "batch_size": 18, "pd_ratio": ratio, "chunk": 256, "chunk_align": align}
        rows += [keys | {"scheduler": "static", "total_throughput_tok_s": 100.0},
                 keys | {"scheduler": "sarathi", "total_throughput_tok_s": 100.0 * gain}]
    return pd.DataFrame(rows)


def _orca() -> pd.DataFrame:
    rows = []
    for length, size, ratio, aligned in ((1024, 18, 15.0, 114.0), (2048, 18, 15.0, 150.0)):
        keys = {"seq_len": length, "batch_size": size, "pd_ratio": ratio, "chunk": 256}
        for scheduler, stagger, align, throughput in (("static", 0, "none", 100.0), ("orca", 18, "none", 104.0),
                                                      ("sarathi", 0, "none", 99.0), ("sarathi", 0, "tile", aligned)):
            rows.append(keys | {"scheduler": scheduler, "workload.stagger": stagger, "chunk_align": align,
                                "total_throughput_tok_s": throughput, "run_dir": f"{length}{scheduler}{align}"})
    return pd.DataFrame(rows)


def test_each_headline_with_either_alignment_and_how_far_it_moves():
    table = sim_chunk_align.table(Frames({("pd_ratio", "summary"): _pd_ratio(),
                                           ("orca_compare", "summary"): _orca()}))
    by = table.set_index(["experiment", "headline", "seq_len"])
    peak = by.loc["pd_ratio", "peak gain over the baseline (x)", 1024]
    assert (peak.fixed, peak.tile_aligned, peak.paper) == pytest.approx((1.01, 1.15, 1.27))
    assert peak.moves == pytest.approx(0.14)
    where = by.loc["pd_ratio", "P:D of the peak", 1024]
    assert (where.fixed, where.tile_aligned, where.paper) == (10, 14, 14)
    sarathi = by.loc["orca_compare", "SARATHI over the baseline (x)", 1024]
    assert (sarathi.fixed, sarathi.tile_aligned) == pytest.approx((0.99, 1.14))
    over_orca = by.loc["orca_compare", "SARATHI over Orca's best case (x)", 1024]
    assert over_orca.tile_aligned == pytest.approx(1.14 / 1.04) and over_orca.paper == pytest.approx(1.27 / 1.11)
    # 1K's batch of 18 at 2K is a what-if: no headline of the paper's setup.
    assert 2048 not in set(table.seq_len)


# The sensitivity tables' one writer (sim_check/sensitivity.py), through each command a user runs.
@pytest.mark.parametrize("command", ["sim_chunk_align", "sim_chunk_pd"])
def test_the_writer_refuses_a_table_another_command_wrote_before_running_anything(tmp_path, command):
    out = tmp_path / "table.csv"
    out.write_text("x\n")
    run = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", command, "--out", str(out)],
                         check=False, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "unknown provenance" in run.stderr and "--force" in run.stderr
    assert out.read_text() == "x\n" and not list(tmp_path.glob("*/multiruns"))
