"""The one packer of steps into calls (measure/gpu/packing.py), which --plan and --next print: no
call over the budget, no step lost, order kept within a call and from group to group, and the calls
the worker itself makes, deferring a step that would outlast the call's deadline (worker.py)."""
from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from sarathi_lab.measure.gpu.packing import pack


@dataclass(frozen=True)
class Item:
    name: str
    minutes: float


def _groups(minutes: st.SearchStrategy[float]):
    """Groups of named items (names unique: a step is found by its name)."""
    return st.lists(st.lists(minutes, max_size=8), max_size=5).map(
        lambda groups: [[Item(f"g{g}.s{i}", m) for i, m in enumerate(group)]
                        for g, group in enumerate(groups)])


# Any positive minutes, rounding and all; and multiples of 1/8 minute, summed exactly.
ANY = st.floats(0.01, 40.0, allow_nan=False)
EIGHTHS = st.integers(1, 320).map(lambda k: k / 8)


@settings(max_examples=300, deadline=None)
@given(groups=_groups(ANY), budget=ANY)
def test_no_call_over_the_budget_no_step_lost_and_the_order_kept(groups, budget):
    packed = pack(groups, budget)
    # Over the budget only where one step alone exceeds it, and such a step is in no call.
    assert all(call and sum(s.minutes for s in call) <= budget * (1 + 1e-12) for call in packed.calls)
    assert all(s.minutes > budget for s in packed.too_long)
    given_order = [s.name for g in groups for s in g]
    placed = [s.name for call in packed.calls for s in call] + [s.name for s in packed.too_long]
    assert sorted(placed) == sorted(given_order)
    position = {name: i for i, name in enumerate(given_order)}
    group_of = {s.name: g for g, group in enumerate(groups) for s in group}
    for call in packed.calls:
        assert [position[s.name] for s in call] == sorted(position[s.name] for s in call)
        assert len({group_of[s.name] for s in call}) == 1
    firsts = [group_of[call[0].name] for call in packed.calls]
    assert firsts == sorted(firsts)
    assert [position[s.name] for s in packed.too_long] == sorted(position[s.name] for s in packed.too_long)


@settings(max_examples=300, deadline=None)
@given(groups=_groups(ANY), budget=ANY)
def test_a_step_waits_only_for_a_call_it_did_not_fit(groups, budget):
    # First-fit: a step in a group's later call would have outlasted every earlier call of it, with
    # what that call had started before it.
    packed = pack(groups, budget)
    position = {s.name: i for i, s in enumerate(s for g in groups for s in g)}
    for g, group in enumerate(groups):
        mine = [call for call in packed.calls if call[0].name.startswith(f"g{g}.")]
        for k, call in enumerate(mine):
            for step in call:
                for earlier in mine[:k]:
                    before = sum(s.minutes for s in earlier if position[s.name] < position[step.name])
                    assert before + step.minutes > budget * (1 - 1e-12), (step, earlier)


def _as_the_worker_runs(group: list[Item], budget: float) -> list[list[str]]:
    """Calls of one group as repeated calls of the suite run them: each from a clock at 0 with a
    deadline of ``budget``, a step started unless the clock plus its minutes passes the deadline
    (worker.py), the deferred ones in the next call; one longer than a call is never started."""
    pending, calls = [s for s in group if s.minutes <= budget], []
    while pending:
        clock, started, deferred = 0.0, [], []
        for step in pending:
            if clock + step.minutes > budget:
                deferred.append(step)
            else:
                clock += step.minutes
                started.append(step.name)
        calls.append(started)
        pending = deferred
    return calls


@settings(max_examples=300, deadline=None)
@given(groups=_groups(EIGHTHS), budget=EIGHTHS)
def test_the_calls_are_the_ones_the_worker_makes(groups, budget):
    expected = [call for group in groups for call in _as_the_worker_runs(group, budget)]
    assert [[s.name for s in call] for call in pack(groups, budget).calls] == expected
