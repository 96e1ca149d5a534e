"""bench/plan_cost.py: a simulated run's batches replayed through the attention planner, its plan
cache's hits counted and its time set against the predicted forward pass."""
import numpy as np
import pytest

from sarathi_lab.engine.next_batch import NextBatch
from sarathi_lab.measure.bench import plan_cost


def test_a_batch_met_again_hits_the_cache_and_the_uncached_replay_never_does():
    # (query lengths, contexts, prefills, forward s): a chunk beside two decodes, then decodes only,
    # each twice; the second decode batch crosses a key tile, so it plans afresh.
    hybrid = ([512, 1, 1], [1024, 700, 900], 1, 0.02)
    decodes = ([1, 1], [701, 901], 0, 0.01)
    crossed = ([1, 1], [701, 4000], 0, 0.01)
    seen = [hybrid, hybrid, decodes, decodes, crossed]
    cached = plan_cost.replay(seen)
    # Lookups: 2 + 2 + 1 + 1 + 1; misses: the chunk, its decodes, the decodes alone, the crossed.
    assert cached["hit_rate"] == 1 - 4 / 7 and len(cached["plan_us"]) == len(seen)
    assert plan_cost.replay(seen, cached=False)["hit_rate"] == 0.0
    row = plan_cost.summarize(seen, cached, "cached")
    share = np.array(cached["plan_us"]) / np.array([s[-1] for s in seen]) / 1e6
    assert row["plan_share_p99"] == pytest.approx(np.percentile(share, 99), rel=1e-9)
    assert row["iterations"] == 5 and row["met"] == (row["plan_share_p99"] < plan_cost.TARGET)


def test_a_successor_planned_ahead_is_a_hit_on_the_critical_path_and_shows_only_past_its_forward():
    # The first forward far longer than any plan: what was planned under it never shows.
    decodes = ([1, 1], [701, 901], 0, 100.0)
    crossed = ([1, 1], [701, 4000], 0, 0.01)
    guess = NextBatch([1, 1], [701, 4000], 0)
    ahead = plan_cost.replay([decodes, crossed], likely=[guess, None])
    # The crossed batch was planned under the first one's forward: its own lookup hits.
    assert ahead["hit_rate"] == 0.5 and plan_cost.replay([decodes, crossed])["hit_rate"] == 0.0
    assert list(ahead["exposed_us"]) == list(ahead["plan_us"])
    row = plan_cost.summarize([decodes, crossed], ahead, "cached+ahead")
    assert row["exposed_share_p99"] <= row["plan_share_p99"] + 1e-12


def test_the_smoke_run_replays_every_iteration_of_a_simulated_run(capsys):
    table = plan_cost.main(["--smoke"])
    assert list(table["planner"]) == ["cached", "cached+ahead", "uncached"]
    assert table["iterations"].nunique() == 1 and table["iterations"][0] > 10
    assert 0 < table["hit_rate"][0] < table["hit_rate"][1] <= 1 and table["hit_rate"][2] == 0
    assert "unreliable while it is shared" in capsys.readouterr().out
