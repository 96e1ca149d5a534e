"""Claims judged on the paper's setups: at each length the batch the paper's A6000 held (Fig. 11a's
18 / 10 / 6, Fig. 8's batch sizes); larger batches are what-ifs, shown beside the verdict, never in
it; and Fig. 13c's claims on a batch by chunk, on hand-made frames whose answers are known."""
from __future__ import annotations

import pandas as pd
import pytest

from sarathi_lab.analysis import derive, paper
from tests.results_frames import Frames
from tests.test_analysis import CHECK, DRAW, _Measured, _on_cpu, _piggyback


def _orca(points) -> Frames:
    """(length, batch, P:D, {variant: throughput}) -> orca_compare's frames."""
    runs = pd.DataFrame([dict(scheduler=s, total_throughput_tok_s=t, run_dir=f"{length}-{size}-{s}-{g}",
                              seq_len=length, batch_size=size, pd_ratio=pd_, **{"workload.stagger": g})
                         for length, size, pd_, by in points
                         for (s, g), t in by.items()])
    iterations = pd.DataFrame({"run_dir": runs.run_dir, "num_prefill_tokens": 256, "num_decode_tokens": 3})
    return Frames({("orca_compare", "summary"): _on_cpu(runs), ("orca_compare", "iterations"): iterations})


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
    (row,) = CHECK["decode_speedup"](Frames({("decode_speedup", "piggyback"): table}))
    assert row["holds"] == "yes" and row["value"] == pytest.approx(4.0)
    assert "4.0x-4.0x over batch sizes 6, 18 and lengths 1024, 3072 (at each length those the paper's" in row["ours"]
    assert row["ours"].endswith("what-if batches beyond the A6000's memory (B=18 at 3072), not judged: 1.5x-1.5x")


def _chunk_batch(gains: dict[tuple[int, str], float], length: int = 1024, size: int = 18) -> Frames:
    """{(chunk, chunk_align): SARATHI's throughput over a baseline of 100} at one setup."""
    keys = {"seq_len": length, "batch_size": size, "pd_ratio": 15.0}
    runs = [dict(scheduler="static", chunk=64, chunk_align="none", total_throughput_tok_s=100.0, **keys)]
    runs += [dict(scheduler="sarathi", chunk=c, chunk_align=a, total_throughput_tok_s=100.0 * g, **keys)
             for (c, a), g in gains.items()]
    return Frames({("chunk_batch", "summary"): _on_cpu(pd.DataFrame(runs))})


PAPER_LIKE = {(64, "none"): 0.95, (128, "none"): 1.05, (128, "tile"): 1.10, (256, "none"): 1.0,
              (256, "tile"): 1.20, (320, "none"): 1.12, (320, "tile"): 1.20, (512, "tile"): 1.08}


def test_chunk_batch_judges_each_chunk_tile_aligned_where_it_ran_and_320_as_the_paper_ran_it():
    about, gains, above = CHECK["chunk_batch"](_chunk_batch(PAPER_LIKE))
    assert (about["holds"], about["ours"], about["value"]) == ("yes", "chunk 64: 0.95x at 1024", 0.95)
    assert (gains["holds"], gains["ours"], gains["value"]) == ("yes", "chunk 128: 1.10x at 1024", 1.10)
    # 320 aligned is 256's chunk: the fixed 320 (1.12x) is the paper's, against 256 aligned (1.20x).
    assert above["holds"] == "yes" and above["value"] == pytest.approx(1.20 / 1.12)
    assert above["ours"].startswith("length 1024: 1.20x against 1.12x (chunk 256 as judged, chunk 320 fixed; "
                                    "every chunk, length 1024: 64 0.95x, 128* 1.10x, 256* 1.20x, 320* 1.20x, "
                                    "512* 1.08x (*: tile-aligned))")
    far = CHECK["chunk_batch"](_chunk_batch(PAPER_LIKE | {(64, "none"): 0.5, (320, "none"): 1.25}))
    assert [r["holds"] for r in far] == ["smaller", "yes", "no"]


def test_chunk_batch_at_a_scaled_down_sweep_reads_its_chunks_as_the_paper_s_scaled_alike():
    # The CPU scale runs a quarter of each chunk: 16 stands for 64, 32 for 128, 64 for 256, 80 for 320.
    scaled = {(c // 4, a): g for (c, a), g in PAPER_LIKE.items()}
    rows = CHECK["chunk_batch"](_chunk_batch(scaled, length=256, size=4))
    assert [r["holds"] for r in rows] == ["yes", "yes", "yes"]
    assert rows[0]["ours"] == "chunk 16 (the paper's 64): 0.95x at 256"
    # A what-if batch is no point of the verdict; a run with no baseline beside it judges nothing.
    what_if = CHECK["chunk_batch"](_chunk_batch(PAPER_LIKE, length=2048, size=18))
    assert what_if[0]["holds"] == "n/a" and what_if[0]["ours"].startswith("not judged")


def test_chunk_batch_figure_draws_the_judged_and_the_fixed_chunks_apart():
    fig = DRAW["chunk_batch"](_Measured(_chunk_batch(PAPER_LIKE).frames))
    judged, fixed = fig.axes[:2]
    assert "the verdict's" in judged.get_title() and "fixed chunks" in fixed.get_title()
    assert [t.get_text() for t in judged.get_xticklabels()] == ["64", "128", "256", "320", "512"]
    assert [round(p.get_height(), 2) for p in judged.patches[:5]] == [0.95, 1.10, 1.20, 1.20, 1.08]
