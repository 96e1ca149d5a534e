"""Claims judged on the paper's setups: at each length the batch the paper's A6000 held (Fig. 11a's
18 / 10 / 6, Fig. 8's batch sizes); larger batches are what-ifs, shown beside the verdict, never in
it; on hand-made frames whose answers are known."""
from __future__ import annotations

import pandas as pd
import pytest

from sarathi_lab.analysis import derive, paper
from tests.test_analysis import CHECK, DRAW, _Frames, _Measured, _on_cpu, _piggyback


def _orca(points) -> _Frames:
    """(length, batch, P:D, {variant: throughput}) -> orca_compare's frames."""
    runs = pd.DataFrame([dict(scheduler=s, total_throughput_tok_s=t, run_dir=f"{length}-{size}-{s}-{g}",
                              seq_len=length, batch_size=size, pd_ratio=pd_, **{"workload.stagger": g})
                         for length, size, pd_, by in points
                         for (s, g), t in by.items()])
    iterations = pd.DataFrame({"run_dir": runs.run_dir, "num_prefill_tokens": 256, "num_decode_tokens": 3})
    return _Frames({("orca_compare", "summary"): _on_cpu(runs), ("orca_compare", "iterations"): iterations})


def _variants(sarathi: float, orca_best: float) -> dict:
    return {("static", 0): 100.0, ("orca", 0): 100.0, ("orca", 1): orca_best, ("sarathi", 0): sarathi}


def test_a_batch_beyond_the_paper_s_device_is_a_what_if_at_the_paper_s_lengths_only():
    frame = pd.DataFrame({"seq_len": [1024, 2048, 2048, 3072, 256], "batch_size": [18, 10, 18, 6, 64]})
    assert derive.beyond_paper_device(frame).tolist() == [False, False, True, False, False]
    assert paper.LARGEST_BATCH == {1024: 18, 2048: 10, 3072: 6}


def test_orca_compare_judges_the_paper_s_batches_and_shows_the_what_ifs_apart():
    # SARATHI beats Orca's best at the paper's 2K batch of 10; at 1K's 18, a what-if at 2K, it does not.
    frames = _orca([(1024, 18, 15.0, _variants(125.0, 110.0)), (2048, 10, 28.0, _variants(124.0, 101.0)),
                    (2048, 18, 15.0, _variants(100.0, 103.0))])
    (row,) = CHECK["orca_compare"](frames)
    assert row["holds"] == "yes" and row["value"] == pytest.approx(125 / 110)  # the least lead
    assert row["ours"].startswith("length 1024: SARATHI 1.25x, Orca best 1.10x, Orca worst 1.00x; "
                                  "length 2048, B=10: SARATHI 1.24x, Orca best 1.01x")
    assert row["ours"].endswith("what-if batches beyond the A6000's memory, not judged: length 2048, B=18: "
                                "SARATHI 1.00x, Orca best 1.03x, Orca worst 1.00x")
    # The same runs with the what-if among the paper's points would not hold.
    alone = _orca([(2048, 10, 28.0, _variants(100.0, 103.0))])
    assert CHECK["orca_compare"](alone)[0]["holds"] == "no"


def test_orca_figure_labels_each_bar_group_with_its_batch_and_marks_the_what_ifs():
    frames = _orca([(1024, 18, 15.0, _variants(125.0, 110.0)), (2048, 18, 15.0, _variants(100.0, 103.0))])
    fig = DRAW["orca_compare"](_Measured(frames.frames))
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels == ["1024\nB=18", "2048\nB=18\n(what-if)"]
    assert [t.get_text() for t in fig.axes[1].get_xticklabels()] == ["1024\nB=18", "2048\nB=10", "3072\nB=6"]


def test_decode_speedup_judges_the_batch_sizes_the_paper_s_device_held():
    # 4x everywhere the A6000 held the batch; 1.5x at B=18 and 3K, a what-if batch.
    table = pd.concat([_piggyback(size, 40.0, 100.0, 100.0 + 10.0 * (size - 1) / size).assign(seq_len=length)
                       for length, size in ((1024, 18), (3072, 6))]
                      + [_piggyback(18, 40.0, 100.0, 100.0 + 40.0 / 1.5 * 17 / 18).assign(seq_len=3072)])
    (row,) = CHECK["decode_speedup"](_Frames({("decode_speedup", "piggyback"): table}))
    assert row["holds"] == "yes" and row["value"] == pytest.approx(4.0)
    assert "4.0x-4.0x over batch sizes 6, 18 and lengths 1024, 3072 (at each length those the paper's" in row["ours"]
    assert row["ours"].endswith("what-if batches beyond the A6000's memory (B=18 at 3072), not judged: 1.5x-1.5x")
