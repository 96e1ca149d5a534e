"""The suite's steps with expected minutes; targets first, so a cut lease still answers them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sarathi_lab.analysis import registry
from sarathi_lab.analysis.paper_result import GpuPart
from sarathi_lab.harness import scales
from sarathi_lab.measure.gpu import budget, steps
from sarathi_lab.measure.gpu.packing import pack

if TYPE_CHECKING:
    from sarathi_lab.measure.gpu.parts import Estimate


@dataclass(frozen=True)
class Step:
    name: str  # <group>[.<arg>]: sarathi_lab.measure.gpu.steps.<group>.run(ctx, step) does the work
    minutes: float
    what: str  # --plan's line: what runs, at which shapes
    arg: str = ""
    overrides: tuple[str, ...] = ()  # paper sweeps: experiment=<scale>/<arg>[/<part>] overrides

    @property
    def group(self) -> str:
        return self.name.split(".")[0]


# task=profile's longest context per model: as far as batch 18 fits an 80 GB card.
PROFILE_SEQ_LEN = {"llama-13b": 3072, "llama2-7b": 4096, "mistral-7b": 4096}


# Each profile's place among the paper results and minutes: 13B right after the targets.
PROFILES = {"llama-13b": (35, 0.9), "llama2-7b": (90, 0.9), "mistral-7b": (91, 0.9)}
def head_steps() -> tuple[Step, ...]:
    """One step a module of steps/ that declares its place (its STEP), in that order."""
    return tuple(Step(group, d.minutes, d.what) for group, d in steps.head().items())


HEAD: tuple[Step, ...] = head_steps()


def _parts_lines(steps: list[Step], parts: dict[str, Estimate]) -> list[str]:
    """The paper steps' minutes together, and the targets: SARATHI's claim steps in one lease, the
    whole queue in two, set-up under a tenth of each paper step (budget.py)."""
    papers = [s for s in steps if s.group == "paper"]
    if not papers:
        return []
    measured = sum(1 for s in papers if s.name in parts and parts[s.name].source != "planned")
    lines = [f"paper steps: {sum(s.minutes for s in papers):.1f} min ({measured} of {len(papers)} "
             + "from measured parts: set-up once a process, then each step's sweep set-up and "
             "its grid's jobs at their measured seconds, graphs once a set; the others planned)"]
    lines += [f"  process: {group.line()}" for group in budget.group_setups(steps, parts)]
    whole = {s.name for s in steps} >= set(BY_NAME)
    fits = budget.fits(steps) if whole else budget.fits(steps)[:1]
    over = budget.setup_over(steps, parts)
    lines += [f"  {fit.line()}" for fit in fits if fit.minutes]
    lines.append(f"  set-up under {budget.SETUP_SHARE_MAX:.0%} of each paper step (its process's "
                 "spread over the steps that share it): "
                 + ("every one" if not over else f"{len(over)} of {len(papers)} over ("
                    + ", ".join(f"{name} {share:.0%}" for name, share in over.items()) + ")"))
    return lines


def _paper_step(name: str, scale: str, part: GpuPart) -> Step:
    overrides, common = scales.overrides(name, scale, part.name), scales.shared("gpu")
    # What the step sets beside scale/gpu.yaml's shared keys.
    own = overrides[len(common):] if overrides[:len(common)] == common else overrides
    what = f"experiment={scale}/{name}" + (f"/{part.name}" if part.name
                                           else "") + ": " + " ".join(own)
    return Step(".".join(filter(None, ("paper", name, part.name))), part.minutes, what, name,
                overrides)


def build_steps(unscaled: bool = False) -> tuple[Step, ...]:
    """HEAD, then the registered sweeps and profiles in order; ``unscaled``: the paper's setting."""
    scale = "own" if unscaled else "gpu"
    runs = [(r, (r.gpu.unscaled or r.gpu) if unscaled else r.gpu) for r in registry.RESULTS
            if r.gpu is not None]
    papers = [(r.gpu.order, _paper_step(r.name, scale, part)) for r, run in runs
              for part in (run.parts or (GpuPart("", run.minutes),))]
    profiles = [(order, Step(f"profile.{model}", minutes,
                             f"task=profile for {model}, bf16, chunk<=512, batch<=18, "
                             f"context<={PROFILE_SEQ_LEN[model]}, token step 16 (tile pairs at "
                             f"every 128) -> profiles/<device>/{model}.csv", model))
                for model, (order, minutes) in PROFILES.items()]
    ordered = sorted(papers + profiles, key=lambda pair: pair[0])
    return head_steps() + tuple(step for _, step in ordered)


STEPS: tuple[Step, ...] = build_steps()
BY_NAME = {s.name: s for s in STEPS}
GROUPS = tuple(dict.fromkeys(s.group for s in STEPS))
# What `--own` runs: each paper sweep at the paper's setting.
UNSCALED_STEPS: tuple[Step, ...] = build_steps(unscaled=True)


def steps_of(unscaled: bool) -> tuple[Step, ...]:
    return UNSCALED_STEPS if unscaled else STEPS


def by_name(unscaled: bool) -> dict[str, Step]:
    return {s.name: s for s in steps_of(unscaled)}


def named(spec: str | None) -> set[str]:
    return {w.strip() for w in (spec or "").split(",") if w.strip()}


def _result_of(step: Step) -> str:
    """``paper.<name>`` of a result split into parts."""
    return f"{step.group}.{step.arg}" if step.group == "paper" else step.name


def select(spec: str | None, unscaled: bool = False) -> list[Step]:
    """Steps named by ``spec`` (names, groups, ``paper.<name>``) in suite order."""
    steps = steps_of(unscaled)
    if not spec:
        return list(steps)
    wanted = named(spec)
    known = {*(s.name for s in steps), *GROUPS, *map(_result_of, steps)}
    unknown = sorted(w for w in wanted if w not in known)
    if unknown:
        raise ValueError(f"--steps={spec!r} is invalid: {unknown[0]!r} is no step; allowed: "
                         f"{', '.join(GROUPS)} or one of {', '.join(s.name for s in steps)}")
    return [s for s in steps if s.name in wanted or s.group in wanted or _result_of(s) in wanted]


def format_plan(steps: list[Step], budget_min: float | None,
                parts: dict[str, Estimate] | None = None) -> str:
    """``parts``: each paper step's expected seconds in parts (queue.measured), shown apart."""
    w = max([28, *(len(s.name) + 1 for s in steps)])
    shown = parts is not None
    lines = [f"{'step':{w}} {'min':>5}  " + (f"{'set-up':>6} {'jobs':>13} {'graphs':>6} "
                                              f"{'share':>5}  " if shown else "") + "what"]
    shares = budget.setup_shares(steps, parts or {})
    for s in steps:
        e = (parts or {}).get(s.name)
        split = "" if not shown else (
            f"{e.process_s + e.setup_s:5.0f}s {f'{e.jobs} x {e.job_s:.1f}s':>13} "
            f"{e.capture_s:5.0f}s {shares.get(s.name, budget.setup_share(e)):5.0%}  "
            if e else " " * 35)
        lines.append(f"{s.name:{w}} {s.minutes:5.1f}  {split}{s.what}")
    total = sum(s.minutes for s in steps)
    lines.append(f"{'total':{w}} {total:5.1f}  expected (1.3 x the longer of the H200's and "
                 "H100's; else estimates)")
    if shown:
        lines += _parts_lines(steps, parts)
    lines.append(f"(paper steps beside scale/gpu.yaml's {' '.join(scales.shared('gpu'))})")
    if budget_min is None:
        lines.append(f"\none run of about {total / 60:.1f} hours, no call budget (the paper's "
                     "settings: each result's arithmetic from "
                     "the lease's measured jobs, in its module)")
        return "\n".join(lines)
    lines.append(f"\ncalls of {budget_min:g} min (--budget-min; what is still due: --next):")
    # The selection is one group: a plain call runs every selected step it can, in suite order.
    packed = pack([steps], budget_min)
    for i, call in enumerate(packed.calls, 1):
        lines.append(f"  call {i}: {sum(s.minutes for s in call):4.1f} min  "
                     f"{', '.join(s.name for s in call)}")
    if packed.too_long:
        lines.append(f"  not started at --budget-min={budget_min:g}: "
                     + ", ".join(f"{s.name} ({s.minutes:g} min)" for s in packed.too_long))
    return "\n".join(lines)
