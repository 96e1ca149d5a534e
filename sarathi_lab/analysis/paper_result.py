"""What a paper result declares: its experiment, its claim check, its figure and its GPU run (each
result's module in ``analysis/paper_results/`` holds all four)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class GpuPart:
    """One step of a sweep that one call cannot hold: ``paper.<result>.<name>``, the result's overrides
    plus these, into the result's one sweep folder."""
    name: str
    overrides: str
    minutes: float


@dataclass(frozen=True)
class Unscaled:
    """A GpuRun's sweep at the paper's setting, where the lease's is scaled down to fit its calls: what
    ``python -m sarathi_lab.gpu --own`` runs on a researcher's own GPU, which has no call budget.
    ``overrides`` and ``parts`` replace the GpuRun's (Hydra refuses a key given twice)."""
    overrides: str
    minutes: float        # expected, by the arithmetic beside it (GpuRun.minutes' sources, scaled up)
    parts: tuple[GpuPart, ...] = ()


@dataclass(frozen=True)
class GpuRun:
    """The result's sweep on one GPU: gpu/plan.py's PAPER_COMMON with ``overrides``; ``dry``: the
    one tiny CPU job of the suite's dry run. ``parts``: the steps the sweep is split into where one
    call cannot hold it (``minutes`` then is theirs summed)."""
    minutes: float        # expected, interpreter and model builds included (gpu/plan.py says from what)
    overrides: str
    dry: str
    order: int            # where it runs in the suite (gpu/plan.py orders the profile steps by it too)
    parts: tuple[GpuPart, ...] = ()
    unscaled: Unscaled | None = None   # None: ``overrides`` are already the paper's setting


@dataclass(frozen=True)
class PaperResult:
    name: str                                     # experiment=NAME, and the results root's folder
    order: int                                    # where it runs, is drawn and is tabled
    claims: Callable[[Any], list[dict]]           # Results -> its claims rows (claims.claim_row)
    # (results, simulated=None) -> Figure; it imports matplotlib itself, so that the registry does not.
    figure: Callable[..., Any]
    reading: str = ""                             # markdown under the figure's heading: what to look for
    # Why a claim's verdict differs between the simulator's cost models where it does: the claims
    # table's note on those rows (claims.mark_cost_model_differences), by claim text.
    cost_models_differ: dict[str, str] = field(default_factory=dict)
    gpu: GpuRun | None = None
