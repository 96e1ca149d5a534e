"""What a paper result declares: its experiment, claim check, figure and GPU run."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def gpu_minutes(startup_s: float, job_s: float, jobs: int, slower: float = 1.0) -> float:
    """Expected GPU minutes: start-up plus jobs at measured seconds, times ``slower`` and 1.3."""
    return round(1.3 * slower * (startup_s + jobs * job_s) / 60, 1)


@dataclass(frozen=True)
class GpuPart:
    """A step of a sweep too long for one call: ``paper.<result>.<name>``, into its sweep folder."""
    name: str
    minutes: float


@dataclass(frozen=True)
class Unscaled:
    """The sweep at the paper's setting (``experiment=own/<result>``) that ``--own`` runs."""
    minutes: float
    parts: tuple[GpuPart, ...] = ()


@dataclass(frozen=True)
class GpuRun:
    """The result's GPU sweep, ``experiment=gpu/<result>``; ``parts`` where one call can't."""
    minutes: float        # expected, interpreter and model builds included
    order: int  # its place in the suite (which orders the profiles by it too)
    parts: tuple[GpuPart, ...] = ()
    unscaled: Unscaled | None = None   # None: ``gpu/<result>`` is already the paper's setting


@dataclass(frozen=True)
class PaperResult:
    name: str                                     # experiment=NAME, and the results root's folder
    order: int                                    # where it runs, is drawn and is tabled
    claims: Callable[[Any], list[dict]]           # Results -> its claims rows (claims.claim_row)
    # (results, simulated=None) -> Figure; imports matplotlib itself, so the registry does not
    figure: Callable[..., Any]
    reading: str = ""  # markdown under the figure's heading: what to look for
    # Why a claim's verdict differs between cost models, by claim text.
    cost_models_differ: dict[str, str] = field(default_factory=dict)
    gpu: GpuRun | None = None
    # (a lease's claims row short of "yes", the lease, its device's tables) -> the row split into
    # the device's part and our engine's (analysis/claim_attribution.py); None: its sweep at the
    # device's floors beside ours (claim_attribution.at_floors).
    attribute: Callable[[dict, Any, Any], dict] | None = None
    # Its runs in the simulator-against-measured smoke (``measure sim_vs_gpu --smoke``), each its
    # overrides at the dry scale; (): none.
    smoke_runs: tuple[tuple[str, ...], ...] = ()
    # How a claim starts -> the reader of a lease's row of it written before two-sided verdicts,
    # (row, lease folder) -> gpu_rejudge.Read or None (analysis/gpu_rejudge.py).
    rejudge: dict[str, Callable[[dict, Any], Any]] = field(default_factory=dict)
    # False: not run on the simulator (``executor=sim`` refuses its real ranks).
    simulated: bool = True
