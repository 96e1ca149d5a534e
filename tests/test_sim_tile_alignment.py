"""The tile-aligned chunk beside the fixed one: chunk + riding decodes fill whole tiles, and the
decode speedup it gives is task=piggyback's own quantity over predicted iterations."""
from __future__ import annotations

import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sarathi_lab.engine.tiles import aligned_chunk
from sarathi_lab.measure.bench.tile_alignment import piggyback_ms, sweep
from sarathi_lab.sim import CostModel


@given(chunk=st.integers(128, 2048), batch_size=st.integers(2, 120))
def test_the_aligned_chunk_fills_whole_tiles_and_never_grows(chunk, batch_size):
    c = aligned_chunk(chunk, batch_size - 1)
    assert (c + batch_size - 1) % 128 == 0
    assert 1 <= c <= chunk
    assert chunk + batch_size - 1 - (c + batch_size - 1) < 128


def test_a_batch_with_no_room_for_a_chunk_is_refused():
    with pytest.raises(ValueError, match="leaves no room"):
        aligned_chunk(100, 128)


def test_piggyback_iterations_are_the_tasks_three():
    cm = CostModel.for_device("a100", "llama2-7b", "calibrated")
    table = piggyback_ms(cm, 256, 6, 1024).set_index("iteration")
    assert table.loc["hybrid", "tokens"] == 256 + 5 and table.loc["decode_only", "tokens"] == 6
    assert table.loc["hybrid", "ms"] > table.loc["chunk_alone", "ms"]


def test_aligning_the_chunk_raises_the_decode_speedup_on_the_measured_gpu_kernels():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = sweep(cases=(("llama2-7b", "a100", ("profile", "calibrated")),), seq_lens=(1024,), batch_sizes=(6, 18))
    wide = table.pivot_table(index=["cost_model", "batch_size"], columns="alignment", values="gain")
    # The fixed chunk's hybrid runs one tile past the chunk alone; the aligned one does not.
    assert (wide.aligned > 1.3 * wide.unaligned).all()
