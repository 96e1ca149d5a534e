"""The GPU queue (``--next``): what is due at this engine code, as calls, most valuable first."""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from sarathi_lab.analysis import gpu_records
from sarathi_lab.analysis.gpu_records import StepResult
from sarathi_lab.harness import scales
from sarathi_lab.measure.gpu import archive_members, engine_code, parts, process_groups, state
from sarathi_lab.measure.gpu.packing import pack
from sarathi_lab.measure.gpu.parts import Estimate, StepParts
from sarathi_lab.measure.gpu.plan import BY_NAME, STEPS, Step
from sarathi_lab.measure.gpu.steps.paper import job_overrides

# Measured minutes times this: a step runs longer on a cold or busier machine.
MARGIN = 1.3
# Never-measured steps that may run long are stopped at this many times their planned minutes.
CAPS = {"attention": 1.5}
# Swept keys that change a job's requests, not its engine's shapes: its CUDA graphs are another
# job's of the same other keys (the shared engine captures a set once).
SHAPELESS = ("seed", "pd_ratio", "workload.", "capacity.", "slo", "measure.")
# A paper step's set-up where none was measured: its interpreter, Hydra and the sweep's checks.
PLANNED_SETUP_S = 20.0


@dataclass(frozen=True)
class Call:
    steps: tuple[str, ...]  # step names, or a prefix naming several
    shows: str
    predictions: str


QUEUE: tuple[Call, ...] = (
    Call(("env", "launch", "attention", "hybrid", "tune", "engine", "overhead"),
         "launch: engine_over_floor[c=..+b=..] and engine_over_sequential_floor[...] for every "
         "iteration kind, tile-aligned chunks included, at contexts 1K and 3K (targets: <= 1.15x "
         "the sequential floor from 256 tokens, <= 1.25x the physical floor at c=256-512 + 17 "
         "decodes once co-scheduled, <= 1.5x at 64-128), and where each iteration's time goes; "
         "attention: attention_over_best_peer <= 1.2 at every prefill and chunk, "
         "attention_over_floor <= 2 for chunks over 1K+ prefixes, <= 1.2 for decodes; hybrid: "
         "hybrid_attention_over_sequential <= 0.8 at c=256-512 with 16-32 decodes at 1-3K; tune: "
         "the per-device table; engine: greedy tokens equal transformers'; overhead_fraction < 5%",
         "docs/sim/predictions_chunked_prefill.md"),
    # decode_speedup first: a cut sweep resumes with its finished jobs kept.
    Call(("paper.decode_speedup", "paper.orca_compare"),
         "Fig. 8: decode throughput gain 2.8-10x; Fig. 11a: SARATHI over Orca's best case (paper "
         "1.27x vs 1.11x); fixed and tile-aligned chunks, three seeds, min-max spread",
         "docs/sim/predictions_h100_calibrated.md"),
    Call(("paper.pd_ratio",),
         "Fig. 9/11b: the gain's peak at P:D = C/(B-1), >= "
         "10%; fixed and tile-aligned chunks, three seeds",
         "docs/sim/predictions_h100_calibrated.md"),
    Call(("paper.capacity.strict", "paper.scheduler_latency"),
         "Sarathi-Serve: capacity under the strict P99 TBT SLO (sarathi_serve / vllm, predicted "
         "2.83x); P99 TBT and median TTFT of sarathi_serve, vllm and orca at two rates, three "
         "seeds (within 15% of the prediction; the seeds' spread)",
         "docs/sim/predictions_<device>_1b71ba5.csv"),
    Call(("profile.llama-13b", "profile.mistral-7b"),
         "the simulator's tables of the graph-replayed engine, and the calibration fitted from "
         "them (python -m sarathi_lab.measure calibration): per-iteration median "
         "error <= 10% per iteration kind (measure sim_vs_gpu)",
         "measure sim_vs_gpu (the profile's own predictions)"),
    Call(("paper.chunk_batch",),
         "Fig. 13c: a batch's end-to-end gain over the baseline by chunk at the paper's 1K setup "
         "(B = 18, P:D 15), decodes riding: chunk 64 about the baseline, 128 up to 1.16x, 256 "
         "above 320; fixed and tile-aligned chunks, three seeds",
         "experiment=sim/chunk_batch (python -m sarathi_lab.produce chunk_batch --sim)"),
)
REST = Call((), "every other step of the suite, in suite order",
            "the claims (analysis.claims) of the run before")


def matches(pattern: str, step: Step) -> bool:
    return step.name == pattern or step.name.startswith((pattern + ".", pattern + "-"))


def ordered() -> list[tuple[Call, list[Step]]]:
    """Each call with the steps it names (names the suite lacks skipped); then REST with others."""
    placed, calls = set(), []
    for call in QUEUE:
        chosen = [s for pattern in call.steps for s in STEPS if matches(pattern, s)
                  and s.name not in placed]
        placed.update(s.name for s in chosen)
        calls.append((call, chosen))
    return [*calls, (REST, [s for s in STEPS if s.name not in placed])]


@dataclass(frozen=True)
class Record:
    """One earlier result of a step: where, how long, at which engine code."""
    step: str
    status: str
    seconds: float
    started_at: float
    commit: str
    code: str  # engine_code hash, recorded or from its commit; "" where unknown
    device: str          # h100, h200, or where an out directory says it ran
    run: str             # the kept run's folder, or the out directory / archive read
    jobs_done: int = 0  # a stopped paper sweep's finished jobs
    jobs_total: int = 0  # and all its jobs (0: not a stopped sweep)


def _records(results: list[StepResult], device: str, run: str) -> list[Record]:
    """A summary's step results; a dry run measured nothing and is skipped."""
    return [Record(r.step, r.status, r.seconds, r.started_at, r.commit, r.code, device, run)
            for r in results if r.device != "cpu"]


def kept_runs(root: Path) -> list[Record]:
    """Every run kept under ``root``; a damaged one is skipped with a warning."""
    return [r for kept in gpu_records.kept_leases(root)
            for r in _records(kept.summary.steps, kept.folder.parent.name, kept.folder.name)]


def kept_parts(root: Path) -> list[StepParts]:
    """Every kept lease's paper steps in parts (parts.py)."""
    return [p for kept in gpu_records.kept_leases(root)
            for p in parts.lease_parts(kept.folder, kept.summary)]


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def launched_jobs(step: Step) -> list[tuple[str, ...]]:
    """The step's jobs as its sweep launches them: a job differing from an earlier one only in a
    scheduler knob its scheduler ignores runs once (sweep_check.collapse_ignored's rule, read from
    the schedulers' configs without composing each job), unless the experiment repeats them."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from sarathi_lab.harness import CONF_DIR
    from sarathi_lab.harness.schema import RunConfig
    from sarathi_lab.harness.sweep_check import without_excluded

    experiment = OmegaConf.load(CONF_DIR / "experiment" / f"{step.arg}.yaml")
    repeat = OmegaConf.select(experiment, "hydra.sweeper.repeat_ignored", default=False)
    task = experiment.get("task", "serve")
    jobs = [tuple(job) for job in without_excluded(exclude_rules(step),
                                                   [list(j) for j in job_overrides(step)])[0]]
    if repeat:
        return jobs
    kept: dict[tuple[str, ...], tuple[str, ...]] = {}
    for job in jobs:
        scheduler = next((o.split("=", 1)[1] for o in job if _key(o) == "scheduler"), None)
        run = SimpleNamespace(task=task, scheduler=SimpleNamespace(name=scheduler),
                              token_budget=None)


        def ignored(override: str, run=run, scheduler=scheduler) -> bool:
            key = _key(override)
            knob = key in ("chunk", "token_budget") or key.startswith("scheduler.")
            return scheduler is not None and knob and RunConfig.ignores(run, key) is not None

        kept.setdefault(tuple(o for o in job if not ignored(o)), job)
    return list(kept.values())


def exclude_rules(step: Step) -> list | None:
    """The step's hydra.sweeper.exclude, as its command line gives it to the sweeper."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    given = [o for o in step.overrides if o.split("=", 1)[0] == scales.EXCLUDE]
    return OverridesParser.create().parse_overrides(given)[0].value() if given else None


def graph_sets(jobs: list[tuple[str, ...]]) -> int:
    """The jobs that differ in a key that shapes the engine (every key but SHAPELESS)."""
    return len({tuple(o for o in job if not _key(o).startswith(SHAPELESS)) for job in jobs})


def measured_estimate(step: Step, measured: list[StepParts]) -> Estimate | None:
    """From each device's newest lease with the step's parts, the longest estimate; leases that
    kept their runs' seconds first (the others' jobs hold a build each)."""
    newest: dict[str, StepParts] = {}
    for p in sorted((p for p in measured if p.step == step.name), key=lambda p: p.where):
        newest[p.where.split()[0]] = p
    jobs = launched_jobs(step)
    found = [e for p in newest.values()
             if (e := parts.estimate(p, len(jobs), graph_sets(jobs))) is not None]
    timed = [e for e in found if not e.source.endswith(parts.AS_MEASURED)] or found
    return max(timed, key=lambda e: e.seconds, default=None)


def planned_estimate(step: Step) -> Estimate:
    """The plan's minutes in parts: the typical set-up once, the rest over the step's jobs."""
    jobs = len(launched_jobs(step))
    setup = min(PLANNED_SETUP_S, step.minutes * 60 / MARGIN)
    return Estimate(setup, jobs, (step.minutes * 60 / MARGIN - setup) / jobs, 0.0, "planned")


# A paper sweep's finished job (steps/paper.py's sweep_dir).
FINISHED_JOB = re.compile(r"paper/([^/]+)/multiruns/gpu/[^/]+/metrics\.json")


def with_jobs(records: list[Record], files: list[str]) -> list[Record]:
    """Each stopped paper sweep's record: its finished jobs among ``files`` and its jobs in all."""
    done = Counter(m[1] for f in files if (m := FINISHED_JOB.fullmatch(f)))
    out = []
    for r in records:
        step = BY_NAME.get(r.step)
        if (r.status == "incomplete" and step is not None and step.group == "paper"
                and done[step.arg]):
            r = replace(r, jobs_done=done[step.arg], jobs_total=len(job_overrides(step)))
        out.append(r)
    return out


def suite_in_progress(source: Path) -> list[Record]:
    """An unfinished suite's results from its out directory or archive; a damaged one warns."""
    if source.is_dir():
        files = [str(p.relative_to(source))
                 for p in source.glob("paper/*/multiruns/gpu/*/metrics.json")]
        return with_jobs(_records(state.results(source, [s.name for s in STEPS]), "this suite",
                                  source.name), files)
    if not source.is_file():
        return []
    label = f"--restore={source}"
    try:
        with archive_members.open_archive(source, label) as (tar, members):
            summary = archive_members.read_summary(tar, members, label)
    except ValueError as e:  # ArchiveRefused, RecordError
        gpu_records.warn(f"{e}; its steps are taken as not run")
        return []
    return [] if summary is None else with_jobs(
        _records(summary.steps, "this suite", source.name), list(members))


def stopped_minutes(records: list[Record], at_code: Callable[[Record], str],
                    now: str) -> tuple[float, str] | None:
    """A stopped sweep's next call at its last pace; None where uncounted."""
    counted = [r for r in records if r.jobs_total > r.jobs_done > 0]
    if not counted:
        return None
    r = max(counted, key=lambda r: r.started_at)
    resumes = at_code(r) == now
    jobs = r.jobs_total - r.jobs_done if resumes else r.jobs_total
    # Its seconds are the last call's, its jobs every call's: a sweep resumed twice reads fast.
    minutes = round(MARGIN * r.seconds / r.jobs_done * jobs / 60, 1) or 0.1
    what = (f"resumes, {jobs} of {r.jobs_total} jobs left" if resumes
            else f"starts over at this code, {jobs} jobs")
    return minutes, f"measured {r.device} {r.run}: {what}"


@dataclass(frozen=True)
class Planned:
    step: Step
    minutes: float
    source: str          # "planned", or the run whose measured minutes these are
    cap_min: float | None
    due: bool
    done_at: str         # the run that measured it at the current code ("" where due)
    estimate: Estimate | None = None  # a paper step's parts


def plan_steps(records: list[Record], current: Callable[[str], str] = engine_code.step_hash,
               at_commit: Callable[[str, str], str | None] | None = None,
               kept_parts: list[StepParts] = ()) -> dict[str, Planned]:
    """Each step's minutes, and whether it is due at ``current(step)``'s code: a paper step's from
    its ``kept_parts`` (set-up once, its grid's jobs), another's from its measured seconds."""
    at_commit = cache(at_commit or (
        lambda name, commit: engine_code.commit_hash(engine_code.paths_of(name), commit)))
    planned = {}
    for step in STEPS:
        mine = [r for r in records if r.step == step.name]
        now = current(step.name)
        def at_code(r: Record) -> str:
            return r.code or at_commit(r.step, r.commit)

        done = [r for r in mine if r.status == "done" and at_code(r) == now]
        timed = [r for r in mine if r.status in ("done", "incomplete") and r.seconds > 0]
        newest = {r.device: r for r in sorted(timed, key=lambda r: r.started_at)}
        minutes, source = step.minutes, "planned"
        estimate = measured_estimate(step, kept_parts) if step.group == "paper" else None
        if stopped := stopped_minutes(timed, at_code, now):
            # below the plan too, where the finished jobs are not run again
            minutes, source = stopped
        elif estimate is not None:
            # The step as its grid runs today: below the plan too.
            minutes, source = estimate.minutes(MARGIN), f"measured parts: {estimate.shown()}"
        elif newest:
            longest = max(newest.values(), key=lambda r: r.seconds)
            measured = round(MARGIN * longest.seconds / 60, 1) or 0.1
            stopped = " (stopped before it ended)" if longest.status != "done" else ""
            where = f"{longest.device} {longest.run}{stopped}"
            # Never below the plan: an older step may run more now; a stopped one took longer.
            if measured >= step.minutes:
                minutes, source = measured, f"measured {where}"
            else:
                source = f"planned ({measured:g} measured at {where})"
        cap = CAPS.get(step.name)
        if estimate is None and step.group == "paper":
            estimate = planned_estimate(replace(step, minutes=minutes))
        planned[step.name] = Planned(step, minutes, source, cap and round(cap * minutes, 1),
                                     not done, done[-1].device + " " + done[-1].run if done else "",
                                     estimate)
    return planned


def measured(steps: list[Step], root: Path) -> tuple[list[Step], dict[str, Estimate]]:
    """``steps`` with the minutes the leases kept under ``root`` give them (a paper step's from its
    parts, run as one worker runs ``steps``: set-up once a process group), and the paper steps'
    parts."""
    planned = plan_steps(kept_runs(root), kept_parts=kept_parts(root))
    parts = {name: p.estimate for name, p in planned.items() if p.estimate is not None}
    # A stopped sweep's minutes are its jobs left at its last pace, not its parts.
    from_parts = {name for name, p in planned.items()
                  if p.source.startswith(("planned", "measured parts"))}
    parts = process_groups.shared(steps, parts)

    def minutes(step: Step) -> float:
        if step.name in from_parts and step.name in parts:
            return parts[step.name].minutes(MARGIN)
        return planned[step.name].minutes if step.name in planned else step.minutes

    return [replace(s, minutes=minutes(s)) for s in steps], parts


def due_in_order(planned: dict[str, Planned]) -> list[tuple[Call, list[Planned]]]:
    return [(call, [planned[s.name] for s in steps if planned[s.name].due])
            for call, steps in ordered()]


def head(planned: dict[str, Planned], budget_min: float) -> list[str]:
    calls = pack([ps for _, ps in due_in_order(planned)], budget_min).calls
    return [p.step.name for p in calls[0]] if calls else []


def format_queue(planned: dict[str, Planned], budget_min: float, commit: str) -> str:
    """The queue as ``--next`` prints it: what is done at this code, then each call."""
    groups = due_in_order(planned)
    call_of = {p.step.name: call for call, ps in groups for p in ps}
    packed = pack([ps for _, ps in groups], budget_min)
    calls, too_long = packed.calls, packed.too_long
    done = [p for p in planned.values() if not p.due]
    due = sum(len(ps) for _, ps in groups)
    lines = [f"GPU queue at {commit}: {due} steps due, {len(done)} done at this engine code; "
             + f"calls of {budget_min:g} min"]
    if done:
        lines.append("done at this engine (not repeated): "
                     + ", ".join(f"{p.step.name} ({p.done_at})" for p in done))
    for i, call in enumerate(calls, 1):
        lines.append(f"\ncall {i}: {sum(p.minutes for p in call):.1f} min")
        for p in call:
            cap = f", stopped at {p.cap_min:g} min" if p.cap_min else ""
            lines.append(f"  {p.step.name:36} {p.minutes:5.1f}  {p.source}{cap}")
        shown = call_of[call[0].step.name]
        lines += [f"  shows: {shown.shows}", f"  predictions first: {shown.predictions}"]
        lines.append("  runs: python -m sarathi_lab.measure gpu --steps "
                     f"{','.join(p.step.name for p in call)} --budget-min {budget_min:g} --restore "
                     "<the last call's suite.tar.gz>")
    if too_long:
        lines.append(f"\nlonger than a {budget_min:g}-min call (a longer budget runs them): "
                     + ", ".join(f"{p.step.name} ({p.minutes:g} min)" for p in too_long))
    if not calls and not too_long:
        lines.append("\nnothing due: every step is done at this engine code")
    lines.append("\nafter each call: python -m sarathi_lab.measure gpu_collect <its suite.tar.gz>, "
                 "then each result against its prediction "
                 "(python -m sarathi_lab.measure sim_vs_gpu; the "
                 "run's claims.csv) and its floors and attribution (python -m "
                 "sarathi_lab.measure floor_claims <lease>, then python -m "
                 "sarathi_lab.measure attribute <lease>), then --next again")
    return "\n".join(lines)
