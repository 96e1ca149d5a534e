"""Steps into calls of a budget of minutes, one rule for ``--plan`` and ``--next``: the worker's.

A call starts, in order, every step that still fits in the minutes it has left; one that does not
waits for the next call while a later, shorter one starts (worker.py defers a step that would
outlast the call's deadline and goes on). A step longer than the budget is in no call: no call
would start it. Groups are kept apart: a call holds steps of one group only (the queue's calls,
its headline measured before anything else; ``--plan``'s selection is one group)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


class Timed(Protocol):
    @property
    def minutes(self) -> float: ...


T = TypeVar("T", bound=Timed)


@dataclass(frozen=True)
class Packed(Generic[T]):
    calls: list[list[T]]   # each group's calls, the groups in order
    too_long: list[T]      # the steps longer than the budget, in order


def pack(groups: Sequence[Sequence[T]], budget_min: float) -> Packed[T]:
    calls: list[list[T]] = []
    too_long: list[T] = []
    for group in groups:
        left = []
        for step in group:
            (too_long if step.minutes > budget_min else left).append(step)
        while left:
            call, rest, room = [], [], budget_min
            for step in left:
                if step.minutes <= room:
                    call.append(step)
                    room -= step.minutes
                else:
                    rest.append(step)
            calls.append(call)
            left = rest
    return Packed(calls, too_long)
