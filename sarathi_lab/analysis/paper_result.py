"""What a paper result declares: its experiment, its claim check, its figure and its GPU run's place
and minutes (each result's module in ``analysis/paper_results/`` holds them; the keys each scale
sets are its experiment's overlays, ``conf/experiment/<scale>/<name>.yaml``)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def gpu_minutes(startup_s: float, job_s: float, jobs: int, slower: float = 1.0) -> float:
    """A sweep's expected minutes on the GPU: its start-up (interpreter, model build) and its jobs
    at the seconds each took on the card that ran it, times ``slower`` for the slower card the suite
    may get, times 1.3 for what runs vary (gpu/plan.py's rule)."""
    return round(1.3 * slower * (startup_s + jobs * job_s) / 60, 1)


@dataclass(frozen=True)
class GpuPart:
    """One step of a sweep that one call cannot hold: ``paper.<result>.<name>``, the overlay
    ``experiment=<scale>/<result>/<name>`` (the result's keys plus the part's), into the result's
    one sweep folder."""
    name: str
    minutes: float


@dataclass(frozen=True)
class Unscaled:
    """A GpuRun's sweep at the paper's setting (``experiment=own/<result>``), where ``gpu/<result>``
    is scaled down to fit a time-limited machine: what ``python -m sarathi_lab.gpu --own`` runs on a
    researcher's own GPU."""
    minutes: float
    parts: tuple[GpuPart, ...] = ()


@dataclass(frozen=True)
class GpuRun:
    """The result's sweep on one GPU, ``experiment=gpu/<result>`` (its overrides are that overlay's,
    its dry run's one tiny CPU job ``dry/<result>``'s). ``parts``: the steps the sweep is split into
    where one call cannot hold it (``minutes`` then is theirs summed)."""
    minutes: float        # expected, interpreter and model builds included (gpu_minutes)
    # where it runs in the suite (gpu/plan.py orders the profile steps by it too)
    order: int
    parts: tuple[GpuPart, ...] = ()
    unscaled: Unscaled | None = None   # None: ``gpu/<result>`` is already the paper's setting


@dataclass(frozen=True)
class PaperResult:
    name: str                                     # experiment=NAME, and the results root's folder
    order: int                                    # where it runs, is drawn and is tabled
    claims: Callable[[Any], list[dict]]           # Results -> its claims rows (claims.claim_row)
    # (results, simulated=None) -> Figure; it imports matplotlib itself, so that the registry does
    # not.
    figure: Callable[..., Any]
    # markdown under the figure's heading: what to look for
    reading: str = ""
    # Why a claim's verdict differs between the simulator's cost models where it does: the claims
    # table's note on those rows (claims.mark_cost_model_differences), by claim text.
    cost_models_differ: dict[str, str] = field(default_factory=dict)
    gpu: GpuRun | None = None
    # False: no run of it on the simulator (``produce --sim`` passes it over): its runs need real
    # ranks (``executor=sim`` refuses them) and each job carries its own prediction beside its
    # measurement.
    simulated: bool = True
