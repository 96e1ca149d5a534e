"""What the GPU queue must fit: GPUs come in leases of 15 minutes of device time, starts included,
of which LEASE_STEP_MIN run steps. Every SARATHI claim step together fits one lease; the whole queue
(the engine checks, profiles and Sarathi-Serve's serving steps included) two; and no paper step
spends more than SETUP_SHARE_MAX of its time setting up (its interpreter, Hydra, the sweep's checks,
its engine's build), which a process group's steps, sharing one process and one engine, pay once
(process_groups.py)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from sarathi_lab.harness import CONF_DIR
from sarathi_lab.measure.gpu import process_groups

if TYPE_CHECKING:
    from sarathi_lab.measure.gpu.parts import Estimate

# plan.py's Step (a step's name, group, arg and minutes): plan imports this module, not the reverse.
Step = Any

LEASE_STEP_MIN = 12.5
CLAIM_LEASES = 1
QUEUE_LEASES = 2
SETUP_SHARE_MAX = 0.10
# An experiment of the Sarathi-Serve paper (its tags): serving, counted in the whole queue only.
SERVING_TAG = "sarathi_serve"


@cache
def serving(arg: str) -> bool:
    """Whether experiment ``arg`` is one of Sarathi-Serve's serving results."""
    tags = OmegaConf.load(CONF_DIR / "experiment" / f"{arg}.yaml").get("tags") or []
    return SERVING_TAG in tags


def claim_steps(steps: list[Step]) -> list[Step]:
    """The paper steps of SARATHI's claims (serving steps apart)."""
    return [s for s in steps if s.group == "paper" and not serving(s.arg)]


@dataclass(frozen=True)
class Fit:
    what: str
    minutes: float
    leases: int

    @property
    def budget_min(self) -> float:
        return self.leases * LEASE_STEP_MIN

    @property
    def fits(self) -> bool:
        return self.minutes <= self.budget_min

    def line(self) -> str:
        within = "fits" if self.fits else f"over by {self.minutes - self.budget_min:.1f} min"
        leases = "one lease" if self.leases == 1 else f"{self.leases} leases"
        return (f"{self.what}: {self.minutes:.1f} of {self.budget_min:g} min ({leases} of "
                f"{LEASE_STEP_MIN:g} min of steps): {within}")


def fits(steps: list[Step]) -> list[Fit]:
    """The SARATHI claim steps against one lease, every step against two."""
    claims = claim_steps(steps)
    return [Fit(f"SARATHI's claim steps ({len(claims)})", sum(s.minutes for s in claims),
                CLAIM_LEASES),
            Fit(f"the whole queue ({len(steps)} steps)", sum(s.minutes for s in steps),
                QUEUE_LEASES)]


def setup_share(estimate: Estimate | None) -> float | None:
    """A step's own set-up (its sweep's; the process's too where it pays it) over its time."""
    return (estimate.process_s + estimate.setup_s) / estimate.seconds \
        if estimate is not None and estimate.seconds else None


@dataclass(frozen=True)
class GroupSetup:
    """A process group's paper steps: the set-up they pay together (the process's once, each
    sweep's own) and the rest of their seconds, their jobs and graphs."""
    engine: str
    steps: tuple[str, ...]
    setup_s: float
    rest_s: float

    @property
    def share(self) -> float:
        return self.setup_s / (self.setup_s + self.rest_s) if self.setup_s + self.rest_s else 0.0

    def line(self) -> str:
        return (f"{self.engine}, one process for {len(self.steps)} paper step"
                f"{'s' * (len(self.steps) != 1)}: set-up {self.setup_s:.0f} s, jobs and graphs "
                f"{self.rest_s / 60:.1f} min: {self.share:.0%} set-up")


def group_setups(steps: list[Step], parts: dict[str, Estimate]) -> list[GroupSetup]:
    """Each process group's paper steps with parts, as one worker runs ``steps``."""
    out = []
    for group in process_groups.groups(steps):
        mine = [parts[s.name] for s in group.paper if s.name in parts]
        if mine:
            setup = sum(e.process_s + e.setup_s for e in mine)
            out.append(GroupSetup(group.engine, tuple(s.name for s in group.paper
                                                      if s.name in parts),
                                  setup, sum(e.seconds for e in mine) - setup))
    return out


def setup_shares(steps: list[Step], parts: dict[str, Estimate]) -> dict[str, float]:
    """Each paper step's set-up share, its process's set-up spread over the steps of its process
    group in proportion to their other seconds (its first pays it; all run on what it built)."""
    shares = {}
    for group in group_setups(steps, parts):
        mine = {name: parts[name] for name in group.steps}
        process = sum(e.process_s for e in mine.values())
        others = {name: e.seconds - e.process_s for name, e in mine.items()}
        total = sum(others.values())
        for name, e in mine.items():
            spread = process * others[name] / total if total else process
            seconds = others[name] + spread
            shares[name] = (e.setup_s + spread) / seconds if seconds else 0.0
    return shares


def setup_over(steps: list[Step], parts: dict[str, Estimate]) -> dict[str, float]:
    """The paper steps spending more than SETUP_SHARE_MAX of their time setting up."""
    return {name: share for name, share in setup_shares(steps, parts).items()
            if share > SETUP_SHARE_MAX}
