"""When each rank computed each micro-batch; perf_counter times, comparable on one machine."""
from __future__ import annotations

import pandas as pd
import torch

from sarathi_lab.model.parallel.wire import PREFILL_TOKENS, TOKENS

# Per row, as kept and sent (float64): command_s host work began; planned_s it ended.
FIELDS = ("micro_batch", "start_s", "end_s", "tokens", "prefill_tokens", "command_s", "planned_s")
COLUMNS = ("rank", "stage", *FIELDS)


class StageTimeline:

    def __init__(self) -> None:
        self.rows: list[tuple[float, ...]] = []
        self.submitted = 0

    def record(self, header: list[int], start_s: float, end_s: float, command_s: float,
               planned_s: float) -> None:
        self.rows.append((self.submitted, start_s, end_s, header[TOKENS], header[PREFILL_TOKENS],
                          command_s, planned_s))
        self.submitted += 1

    def as_tensor(self) -> torch.Tensor:
        return torch.tensor(self.rows, dtype=torch.float64).reshape(-1, len(FIELDS))


def timeline_frame(per_rank: list[torch.Tensor], tp: int) -> pd.DataFrame:
    out = pd.concat([pd.DataFrame(rows.numpy(), columns=list(FIELDS))
                     .assign(rank=rank, stage=rank // tp)
                     for rank, rows in enumerate(per_rank)], ignore_index=True)
    for column in ("micro_batch", "tokens", "prefill_tokens"):
        out[column] = out[column].astype("int64")
    return out.sort_values(["stage", "rank", "micro_batch"], ignore_index=True)[list(COLUMNS)]
