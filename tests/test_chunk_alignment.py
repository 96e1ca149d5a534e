"""The sarathi scheduler's tile-aligned chunks (chunk_align=tile): each iteration's chunk and the
decodes beside it fill whole GEMM tiles, as the paper sized its chunks, and never hold more than
chunk_size + decodes tokens; where no aligned chunk exists the chunk is chunk_size as set."""
from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sarathi_lab import LLM
from sarathi_lab.config import ConfigError
from sarathi_lab.engine.block_manager import BlockManager, blocks_beside_watermark
from sarathi_lab.engine.scheduler import make_scheduler, scheduler_config
from sarathi_lab.engine.tiles import GEMM_TILE, aligned_chunk
from tests.test_scheduler_properties import BLOCK, run_workload


@given(chunk=st.integers(1, 2048), decodes=st.integers(0, 300), tile=st.sampled_from([8, 16, 64, GEMM_TILE]))
def test_the_aligned_chunk_is_the_largest_that_fills_whole_tiles_or_there_is_none(chunk, decodes, tile):
    try:
        c = aligned_chunk(chunk, decodes, tile)
    except ValueError as e:
        assert "leaves no room" in str(e)
        # Every multiple of the tile within chunk + decodes is reached by the decodes alone.
        assert (chunk + decodes) // tile * tile <= decodes
        return
    assert (c + decodes) % tile == 0
    assert 1 <= c <= chunk
    assert chunk - c < tile  # the next larger aligned chunk would pass chunk + decodes


def _no_aligned_chunk(chunk: int, decodes: int, tile: int) -> bool:
    return (chunk + decodes) // tile * tile <= decodes


workloads = st.lists(st.tuples(st.integers(1, 60), st.integers(1, 12)), min_size=1, max_size=10)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=workloads, spare_blocks=st.integers(0, 40), batch_size=st.integers(1, 8), chunk=st.integers(1, 40),
       tile=st.sampled_from([2, 4, 8, 16]))
# Four decodes beside a chunk of 6 in tiles of 8: 10 tokens round down to 8, a chunk of 4.
@example(requests=[(40, 8)] * 5, spare_blocks=40, batch_size=5, chunk=6, tile=8)
def test_aligned_iterations_fill_whole_tiles_never_grow_and_every_request_finishes(requests, spare_blocks, batch_size,
                                                                                  chunk, tile):
    chunk = max(chunk, tile - batch_size + 1)  # what the knob's check allows: some iteration can fill a tile
    num_blocks = blocks_beside_watermark(-(-max(p + n for p, n in requests) // BLOCK), 0.0) + spare_blocks
    seqs, finished, _, executor, scheduler = run_workload(
        "sarathi", requests, num_blocks, batch_size, chunk, knobs={"chunk_align": "tile", "tile": tile})
    assert sorted(s.seq_id for s in finished) == list(range(len(requests)))
    assert [s.num_generated for s in seqs] == [n for _, n in requests]
    assert scheduler.blocks.num_free == num_blocks
    for tokens, decodes, left in (c for c in executor.chunks if c[0]):
        assert tokens <= chunk, "a chunk over chunk_size"
        if _no_aligned_chunk(chunk, decodes, tile):  # the defined fallback: the chunk as set
            assert tokens == min(chunk, left)
        elif tokens < left:  # not a prompt's last chunk, which is what is left of it
            assert (tokens + decodes) % tile == 0, (tokens, decodes, tile)
            assert tokens + tile > chunk, "shrunk past the largest aligned chunk"


def test_a_chunk_with_no_aligned_size_runs_as_set():
    # Tiles of 8, chunk 6: alone, its 6 tokens hold no whole tile, so it stays 6; beside 2 decodes
    # it fills one tile as it is (6 + 2 = 8).
    _, _, _, executor, _ = run_workload("sarathi", [(30, 1)], 64, 3, 6, knobs={"chunk_align": "tile", "tile": 8})
    assert [t for t, _, _ in executor.chunks] == [6, 6, 6, 6, 6]


def test_unaligned_chunks_are_the_chunk_as_set():
    _, _, _, aligned, _ = run_workload("sarathi", [(8, 20), (8, 20), (100, 2)], 64, 3, 16,
                                       knobs={"chunk_align": "tile", "tile": 8})
    _, _, _, fixed, _ = run_workload("sarathi", [(8, 20), (8, 20), (100, 2)], 64, 3, 16)
    long_chunks = lambda ex: [(t, d) for t, d, left in ex.chunks if d == 2 and t < left]
    assert set(long_chunks(fixed)) == {(16, 2)}
    assert set(long_chunks(aligned)) == {(14, 2)}  # 16 + 2 = 18 rounds down to 16 tokens


@pytest.mark.parametrize(("knobs", "error"), [
    ({"chunk_align": "yes"}, r"^chunk_align='yes' is invalid: allowed values are auto, none, tile$"),
    ({"chunk_align": "tile", "tile": 0}, r"^tile=0 is invalid: must be > 0$"),
    ({"chunk_align": "tile"}, (r"^chunk_align='tile' is invalid with chunk_size=16, max_batch_size=4, tile=128: "
                               r"a chunk and its decodes \(at most 19 tokens\) never fill a whole tile; allowed: "
                               r"none, auto, or chunk_size=125 or more, or a smaller tile$")),
])
def test_a_knob_that_cannot_align_is_refused_in_one_line(knobs, error):
    with pytest.raises(ConfigError, match=error):
        scheduler_config("sarathi", knobs, max_batch_size=4, max_model_len=64, chunk_size=16)


@functools.cache
def _llm(chunk_align: str) -> LLM:
    return LLM("tiny", scheduler="sarathi", chunk_size=12, max_batch_size=4, device="cpu", dtype="float32",
               warmup_iters=0, chunk_align=chunk_align, tile=8)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompts=st.lists(st.lists(st.integers(1, 200), min_size=1, max_size=40), min_size=1, max_size=5),
       new_tokens=st.integers(1, 8))
def test_aligned_chunks_change_the_schedule_not_the_greedy_tokens(prompts, new_tokens):
    aligned = _llm("tile").generate(prompts, max_new_tokens=new_tokens)
    assert aligned == _llm("none").generate(prompts, max_new_tokens=new_tokens)


@pytest.mark.parametrize(("chunk", "batch_size", "runs"), [(256, 18, "tile"), (128, 1, "tile"), (112, 17, "tile"),
                                                           (111, 17, "none"), (32, 4, "none")])
def test_chunks_are_tile_aligned_by_default_wherever_a_chunk_beside_decodes_can_fill_a_tile(chunk, batch_size, runs):
    # The default (auto): chunk + batch_size - 1 decodes reach a 128-token tile, so the chunks are
    # aligned (256 beside 17 decodes runs 239); below it none can be, and the chunk runs as set.
    config = scheduler_config("sarathi", {}, max_batch_size=batch_size, max_model_len=4096, chunk_size=chunk)
    assert config.chunk_align == "auto" and config.chunk_alignment == runs
    sized = make_scheduler("sarathi", BlockManager(64, 16), max_batch_size=batch_size, max_model_len=4096,
                           chunk_size=chunk).chunk_tokens(batch_size - 1)
    assert sized == (aligned_chunk(chunk, batch_size - 1) if runs == "tile" else chunk)
    assert scheduler_config("sarathi_serve", {}, max_batch_size=4, max_model_len=64, chunk_size=32).chunk_alignment == (
        "none")


def test_a_run_records_the_alignment_that_ran(tmp_path):
    # metrics.json's config says which alignment ran ("auto" settled), and the analysis reads it there.
    import pandas as pd

    from sarathi_lab.analysis.derive import chunk_align
    from sarathi_lab.harness.compose import run_in_process
    from sarathi_lab.harness.results import read_record

    for chunk, ran in ((32, "none"), (128, "tile")):
        out = tmp_path / str(chunk)
        assert run_in_process(["experiment=smoke", "executor=sim", f"chunk={chunk}", "logger=none"], out) == "ok"
        record = read_record(next(out.rglob("metrics.json")))
        assert record["config"]["chunk_align"] == ran
        assert record["resolved_config"]["scheduler"]["chunk_align"] == "auto"
    # A run from before the record: as its sweep set it, else the old default, none.
    old = pd.DataFrame({"scheduler": ["sarathi", "sarathi", "static"], "scheduler.chunk_align": ["tile", None, "tile"]})
    assert list(chunk_align(old)) == ["tile", "none", "none"]
    assert list(chunk_align(old.assign(chunk_align=["none", "tile", None]))) == ["none", "tile", "none"]
