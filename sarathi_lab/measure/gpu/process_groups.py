"""The worker's process groups: steps run one after another in one process, each building its
engine from the process's shared one (worker.py), so that consecutive steps of one model, dtype and
device build that model once. A group's set-up is paid once: the process's (the interpreter, the
imports, the model's build, its first CUDA graphs) by its first step; each later step pays only its
own sweep's (Hydra's start and the sweep's checks of its jobs). Any other step between them releases
the engine and ends the group."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sarathi_lab.measure.gpu.parts import Estimate

# plan.py's Step: plan imports budget, which imports this module, not the reverse.
Step = Any

# Steps whose runs take their engine from the process's shared one (the harness builds it).
SHARED_ENGINE_GROUPS = ("paper", "profile")
# A sweep's own set-up in a process that has set up already: Hydra's start and the sweep's checks of
# each job. Planned: a lease measured before the steps shared a process paid it inside a step's
# whole set-up; one that ran them in one process measures a later step's set-up as this alone.
SWEEP_SETUP_S = 5.0
_ENGINE_KEYS = {"model": "model", "model.name": "model", "dtype": "dtype", "device": "device"}
# A profile step's engine (steps/profile.py: task=profile on the GPU).
PROFILE_ENGINE = {"dtype": "bfloat16", "device": "cuda"}


def engine_of(step: Step) -> str | None:
    """``model dtype device`` of the engine a paper or profile step builds (the last of each key
    among its overrides); None for a step that builds none from the shared engine."""
    if step.group == "profile":
        return " ".join((step.arg, PROFILE_ENGINE["dtype"], PROFILE_ENGINE["device"]))
    if step.group not in SHARED_ENGINE_GROUPS:
        return None
    found: dict[str, str] = {}
    for override in step.overrides:
        key, _, value = override.partition("=")
        if (name := _ENGINE_KEYS.get(key.lstrip("+~"))) is not None:
            found[name] = value
    return " ".join(found.get(k, "?") for k in ("model", "dtype", "device"))


@dataclass(frozen=True)
class Group:
    engine: str
    steps: tuple[Step, ...]

    @property
    def paper(self) -> list[Step]:
        return [s for s in self.steps if s.group == "paper"]


def groups(steps: list[Step]) -> list[Group]:
    """``steps`` (in the order a worker runs them) as runs of one engine; a step of none is a
    group alone."""
    found: list[Group] = []
    for step in steps:
        engine = engine_of(step)
        if found and engine is not None and found[-1].engine == engine:
            found[-1] = replace(found[-1], steps=(*found[-1].steps, step))
        else:
            found.append(Group(engine or step.name, (step,)))
    return found


def split(estimate: Estimate) -> tuple[float, float]:
    """A step's measured set-up as (the process's, its sweep's own)."""
    own = min(estimate.setup_s + estimate.process_s, SWEEP_SETUP_S)
    return estimate.setup_s + estimate.process_s - own, own


def shared(steps: list[Step], estimates: dict[str, Estimate]) -> dict[str, Estimate]:
    """Each paper step's estimate as its process group runs it: the group's first paper step pays
    the process's set-up (the most any of them paid alone), the others their sweep's own."""
    out = dict(estimates)
    for group in groups(steps):
        paper = [s for s in group.paper if s.name in estimates]
        if not paper:
            continue
        process = max(split(estimates[s.name])[0] for s in paper)
        for i, step in enumerate(paper):
            e = estimates[step.name]
            source = e.source if i == 0 or len(paper) == 1 else (
                f"{e.source}; in {paper[0].name}'s process")
            out[step.name] = replace(e, setup_s=split(e)[1], process_s=process if i == 0 else 0.0,
                                     source=source)
    return out
