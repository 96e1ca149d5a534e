"""What the GPU queue must fit: GPUs come in leases of 15 minutes of device time, starts included,
of which LEASE_STEP_MIN run steps. Every SARATHI claim step together fits one lease; the whole queue
(the engine checks, profiles and Sarathi-Serve's serving steps included) two; and no paper step
spends more than SETUP_SHARE_MAX of its time setting up (its interpreter, Hydra, the sweep's checks,
its engine's build), which a sweep's jobs sharing one process and one engine pay once."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from sarathi_lab.harness import CONF_DIR

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
    return estimate.setup_s / estimate.seconds if estimate is not None and estimate.seconds \
        else None


def setup_over(steps: list[Step], parts: dict[str, Estimate]) -> dict[str, float]:
    """The paper steps spending more than SETUP_SHARE_MAX of their time setting up."""
    return {s.name: share for s in steps if s.group == "paper"
            and (share := setup_share(parts.get(s.name))) is not None and share > SETUP_SHARE_MAX}
