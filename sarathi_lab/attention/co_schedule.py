"""When a hybrid batch's attention runs co-scheduled (``attention_hybrid=pod``): only where a lease
measured that launch faster than the sequential kernels at the nearest shape (the device's tuned
table's ``co_schedule`` entries). Without entries never: the kernel loses as often as it wins."""
from __future__ import annotations

import math
from dataclasses import dataclass

from sarathi_lab.tuned_kernels import co_schedule_entries


@dataclass(frozen=True)
class MeasuredHybrid:
    """A chunk beside ``decodes`` at ``context``: co-scheduled time over sequential."""

    heads: int
    kv_heads: int
    chunk: int
    decodes: int
    context: int
    over_sequential: float


@dataclass(frozen=True)
class CoScheduleRule:
    """The measured shapes (none: never co-schedule)."""

    measured: tuple[MeasuredHybrid, ...] = ()

    def co_schedules(self, group: int, chunk_tokens: int, decodes: int, context: int) -> bool:
        """Whether this batch co-schedules: the nearest measured shape of its group was faster."""
        same = [m for m in self.measured if m.heads // m.kv_heads == group]
        if not same or chunk_tokens < 1 or decodes < 1:
            return False
        shape = (chunk_tokens, decodes, max(context, 1))
        # Shapes compared in log space: doubling any dimension is one step whichever it is.
        nearest = min(same, key=lambda m: sum(abs(math.log2(a / b)) for a, b in
                                              zip((m.chunk, m.decodes, m.context), shape)))
        return nearest.over_sequential < 1.0

    @classmethod
    def from_entries(cls, entries, source: str) -> CoScheduleRule:
        """A table's ``co_schedule`` list's rule: a bad entry fails in one line naming the field."""
        return cls(tuple(MeasuredHybrid(**entry) for entry in co_schedule_entries(source, entries)))


NEVER = CoScheduleRule()


def entries_from_rows(rows: list[dict]) -> list[dict]:
    """A table's ``co_schedule`` entries from hybrid_attention.csv: pod over sequential."""
    return [{**{key: int(row[key]) for key in ("heads", "kv_heads", "chunk", "decodes", "context")},
             "over_sequential": round(float(row["pod_ms"]) / float(row["sequential_ms"]), 4)}
            for row in rows if row.get("pod_ms") and row.get("sequential_ms")]
