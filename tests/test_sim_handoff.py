"""A running pipeline's handoff between stages (sim/handoff.py): read off a hand-built timeline, its
token tables by hand and their properties, how the stage model prices it (sim/stage_profile.py) and how
a micro-batch pays it on its way through the stages (sim/parallel.through_stages), by hand."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarathi_lab.sim.cost_model import IterationCost
from sarathi_lab.sim.handoff import Handoff, TokenTable
from sarathi_lab.sim.link import Link
from sarathi_lab.sim.parallel import StageTimes, through_stages
from sarathi_lab.sim.stage_profile import ProfileStages


def _timeline(command, planned, start, end, tokens=(10, 10, 10)) -> pd.DataFrame:
    rows = [{"stage": s, "micro_batch": k, "command_s": command[s][k], "planned_s": planned[s][k],
             "start_s": start[s][k], "end_s": end[s][k], "tokens": tokens[k]}
            for s in range(len(start)) for k in range(len(start[0]))]
    return pd.DataFrame(rows)


# Three micro-batches over two stages. Stage 0 has each command at 0, 8, 18 and takes 1 s on it; stage 1
# takes 0.2 s on each command, 0.4 s to take the activations in once they and it are ready, and 0.3 s
# after each forward before it has the next command (which stage 0 had before that forward ended).
HAND = _timeline(command=[[0, 8, 18], [0.5, 9.3, 19.3]], planned=[[1, 9, 19], [0.7, 9.5, 19.5]],
                 start=[[1, 9, 19], [5.4, 13.4, 23.4]], end=[[5, 13, 23], [9, 19, 29]])


def test_the_terms_of_a_hand_built_timeline():
    h = Handoff.from_timeline(HAND, "by hand")
    assert h.micro_batches == 3
    assert h.first_host(10) == pytest.approx(1.0) and h.host(10) == pytest.approx(0.2)
    assert h.receive(10) == pytest.approx(0.4) and h.after_s(10) == pytest.approx(0.3)
    assert "3 micro-batches" in h.describe() and "by hand" in h.describe()


def test_a_stage_still_waiting_for_its_next_command_measures_no_after_term():
    # Stage 0 has each next command only after stage 1's forward ended (one micro-batch at a time): the
    # time from that end to the command is waiting, not the stage's own work.
    late = HAND.copy()
    late.loc[(late.stage == 0) & (late.micro_batch > 0), "command_s"] += 2.0
    h = Handoff.from_timeline(late)
    assert h.after is None and h.after_s(10) == 0.0 and "not measured" in h.describe()


def test_a_timeline_without_host_stamps_or_of_one_stage_is_refused():
    with pytest.raises(ValueError, match=r"lacks \['command_s', 'planned_s'\]"):
        Handoff.from_timeline(HAND.drop(columns=["command_s", "planned_s"]))
    with pytest.raises(ValueError, match="two or more stages and micro-batches: 1 stages"):
        Handoff.from_timeline(HAND[HAND.stage == 0])


def test_a_token_table_by_hand():
    t = TokenTable.of(np.array([10, 10, 20, 20, 40, 40, 80, 80, 50]),
                      np.array([1, 3, 2, 2, 5, 5, 8, 9, np.nan]))   # the unmeasured one is dropped
    # Quantile edges 10, 17.5, 30, 50, 80: the medians of each range at its tokens' median.
    assert t.tokens == (10, 20, 40, 80) and t.seconds == (2, 2, 5, 8.5)
    assert t(30) == pytest.approx(3.5) and t(5) == 2 and t(1000) == 8.5
    with pytest.raises(ValueError, match="no micro-batch"):
        TokenTable.of(np.array([1.0]), np.array([np.nan]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4096), st.floats(0, 1e-2)), min_size=1, max_size=60))
def test_a_token_table_is_ordered_and_within_what_was_measured(points):
    tokens, seconds = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    t = TokenTable.of(tokens, seconds)
    assert list(t.tokens) == sorted(set(t.tokens))
    for x in (0, *tokens.tolist(), 10_000):
        assert seconds.min() - 1e-12 <= t(x) <= seconds.max() + 1e-12


class _Whole:
    name, source = "fake", "by hand"

    def iteration_cost(self, prefills, decodes, num_sampled):
        return IterationCost(prepare_s=0.05, forward_s=1.0, sample_s=0.01)


def test_the_stage_model_prices_a_measured_handoff_in_place_of_the_link_s_messages():
    h = Handoff.from_timeline(HAND)
    link = Link.linear(1e-3, 1e6)
    t = ProfileStages(_Whole(), 2, 100, link=link, logits_row_bytes=500, handoff=h).times([(10, 10)], [5, 7], 3)
    assert (t.stage_host_s, t.first_host_s, t.after_s, t.receive_s) == pytest.approx((0.2, 1.0, 0.3, 0.4))
    # The activations' move is in receive_s; the driver's own work and the logits' return are as before.
    assert t.p2p_s == 0.0 and t.host_s == pytest.approx(0.06) and t.return_s == pytest.approx(1e-3 + 1500 / 1e6)
    assert "handoff measured on" in ProfileStages(_Whole(), 2, 100, handoff=h).describe()
    plain = ProfileStages(_Whole(), 2, 100, link=link).times([(10, 10)], [5, 7], 3)
    assert plain.after_s == plain.receive_s == 0.0 and plain.first_host_s is None and plain.p2p_s > 0


def test_a_micro_batch_pays_the_handoff_on_its_way_by_hand():
    times = StageTimes(stage_s=1.0, last_extra_s=0.5, p2p_s=0.0, host_s=0.2, stage_host_s=0.3, after_s=0.25,
                       receive_s=0.1, first_host_s=0.05)
    stage_free, busy = [0.0, 2.0], [0.0, 0.0]
    begins, ends = through_stages(times, 0.0, stage_free, busy)
    # Stage 0: the driver's 0.2, its own 0.05 on the command. Stage 1, free at 2.0, takes the command
    # (0.3), then the activations (0.1); after its forward it sends for 0.25 before it is free.
    assert begins == pytest.approx([0.25, 2.4]) and ends == pytest.approx([1.25, 3.9])
    assert stage_free == pytest.approx([1.25, 4.15]) and busy == pytest.approx([1.0, 1.5])
    begins, ends = through_stages(times, 1.25, stage_free, busy)
    assert begins == pytest.approx([1.5, 4.55]) and ends == pytest.approx([2.5, 6.05])
