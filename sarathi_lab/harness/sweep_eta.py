"""How long a sweep will take, from earlier jobs on this machine (each job's time as its sweep saw
it, kept in the sweep's JOB_TIMES), else from the simulator (sweep_sim_eta): said before the first
job, and as jobs end, with an ETA."""
from __future__ import annotations

import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JOB_TIMES = ".job_times.jsonl"
# Past this a sweep says so before its first job, with how to stop and resume it.
LONG_S = 3600.0


@dataclass(frozen=True)
class Job:
    overrides: tuple[str, ...]      # as the sweep launches it: the same job in another sweep
    kind: str                       # model, executor, task, device: jobs whose times scale
    tokens: int | None              # requests x length: what a job's time scales with
    kept: bool = False              # a finished run its folder keeps (on_existing): no time
    simulated_s: float | None = None  # its serving on the simulator at this CPU's ceilings


def job(overrides: list[str], cfg: Any, kept: bool = False) -> Job:
    """``cfg``: the job's RunConfig (None where it was refused: no estimate)."""
    if cfg is None:
        return Job(_key(overrides), "", None, kept)
    requests = cfg.workload.num_requests
    tokens = requests * cfg.seq_len if cfg.task == "serve" and requests and cfg.seq_len else None
    kind = f"{cfg.model.name}|{cfg.engine.executor}|{cfg.task}|{cfg.device.name}"
    return Job(_key(overrides), kind, tokens, kept)


def _key(overrides) -> tuple[str, ...]:
    # Keys that change nothing a job does, nor how long it takes.
    return tuple(sorted(o for o in overrides
                        if not o.lstrip("+~").startswith(("on_existing=", "logger", "hydra."))))


def record(sweep_dir: Path, done: Job, seconds: float, setup_s: float = 0.0) -> None:
    """``setup_s``: what of ``seconds`` went to building the engine (a job after it in the same
    process reuses it)."""
    line = {"overrides": list(done.overrides), "kind": done.kind, "tokens": done.tokens,
            "seconds": seconds, "setup_s": setup_s, "host": platform.node(), "time": time.time()}
    with open(sweep_dir / JOB_TIMES, "a") as f:
        f.write(json.dumps(line) + "\n")


def past_jobs(sweep_dir: Path) -> list[dict[str, Any]]:
    """Jobs timed on this machine in this sweep and the sweeps beside it (an experiment's)."""
    found = []
    for path in [*sweep_dir.parent.glob(f"*/{JOB_TIMES}")]:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line cut short by a killed sweep
            if isinstance(entry, dict) and entry.get("host") == platform.node():
                found.append(entry)
    return found


@dataclass(frozen=True)
class Estimate:
    seconds: float | None           # None: no earlier job tells
    basis: str                      # "timed" (this job before) or "scaled" (similar jobs' rate)


def _served_s(past_job: dict[str, Any]) -> float:
    """A past job's time without the engine's set-up: what a job that reuses the engine takes."""
    setup = past_job.get("setup_s")
    return past_job["seconds"] - (setup if isinstance(setup, (int, float)) else 0.0)


def setup_estimate(kind: str, past: list[dict[str, Any]]) -> float:
    """The engine's set-up for a kind of job, paid once where a sweep's jobs share one engine:
    the median of the past set-ups that built it (0 where none is known)."""
    built = sorted(p["setup_s"] for p in past if p.get("kind") == kind
                   and isinstance(p.get("setup_s"), (int, float)) and p["setup_s"] > 0)
    return built[len(built) // 2] if built else 0.0


def estimate(this: Job, past: list[dict[str, Any]]) -> Estimate:
    """A job's time without the engine's set-up (the sweep adds it once per kind)."""
    if this.kept:
        return Estimate(0.0, "kept")
    same = [_served_s(p) for p in past if tuple(p["overrides"]) == this.overrides]
    if same:
        return Estimate(sorted(same)[len(same) // 2], "timed")
    alike = [p for p in past if p.get("kind") == this.kind and this.kind and p.get("tokens")]
    if this.tokens and alike:
        rate = sum(_served_s(p) for p in alike) / sum(p["tokens"] for p in alike)
        return Estimate(rate * this.tokens, "scaled")
    if this.simulated_s is not None:
        return Estimate(this.simulated_s, "simulated")
    return Estimate(None, "none")


def duration(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes = round(seconds / 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


class SweepClock:
    """The sweep's expected time before it starts, and its progress as its jobs end."""

    def __init__(self, jobs: list[Job], past: list[dict[str, Any]],
                 no_simulation: str | None = None):
        """``no_simulation``: why the simulator gave no estimate, said where nothing else tells."""
        self.jobs = jobs
        self.no_simulation = no_simulation
        self.estimates = [estimate(j, past) for j in jobs]
        # One engine set-up per kind of job still to run (jobs of a kind share one engine).
        self.setups = {j.kind: setup_estimate(j.kind, past) for j in jobs if not j.kept}
        self.start = time.monotonic()
        self.ended: list[tuple[int, float]] = []     # (job number, seconds without set-up)
        self.paid: dict[str, float] = {}             # kind -> its set-up, once a job paid it

    def before(self) -> list[str]:
        """The expected time, and a line when it is over an hour."""
        n = len(self.jobs)
        count = {b: sum(e.basis == b for e in self.estimates)
                 for b in ("timed", "scaled", "simulated", "kept", "none")}
        if count["kept"] == n:
            return [f"sweep: {n} jobs, all finished before and kept"]
        if not count["timed"] and not count["scaled"] and not count["simulated"]:
            why = f" ({self.no_simulation})" if self.no_simulation else ""
            return [(f"sweep: {n} jobs; no earlier job on this machine to estimate their time "
                     f"from{why}: the progress lines will tell, once the first job has run")]
        total = sum(e.seconds or 0.0 for e in self.estimates) + sum(self.setups.values())
        basis = [f"{count[b]} {what}" for b, what in (
            ("timed", "as timed before"), ("scaled", "scaled from similar jobs' time per token"),
            ("simulated", ("served on the simulator at this CPU's measured ceilings, a floor: "
                           "the model's loading not counted")),
            ("kept", "finished before, kept")) if count[b]]
        unknown = (f"; {count['none']} more with no earlier job to tell, not counted"
                   if count["none"] else "")
        earlier = "earlier jobs here" if count["timed"] or count["scaled"] else "the simulator"
        least = "at least" if count["simulated"] else "about"
        line = (f"sweep: {n} jobs, expected to take {least} {duration(total)} on this machine, "
                f"from {earlier} ({', '.join(basis)}){unknown}")
        return [line, self._long(total)] if total > LONG_S else [line]

    @staticmethod
    def _long(total: float) -> str:
        return (f"this sweep is expected to run over an hour (about {duration(total)}): Ctrl-C "
                "stops it keeping every finished job, and prints the command that resumes it")

    def job_ended(self, num: int, seconds: float, setup_s: float = 0.0) -> str:
        """'sweep: 3 of 20 jobs done in 4m; about 23m left (ETA 14:32)'. ``setup_s``: what of
        ``seconds`` built the engine, which the jobs after it reuse: not scaled to them."""
        self.ended.append((num, seconds - setup_s))
        if num < len(self.jobs):
            kind = self.jobs[num].kind
            self.paid[kind] = self.paid.get(kind, 0.0) + setup_s
        done = {n for n, _ in self.ended}
        elapsed = time.monotonic() - self.start
        left = self._left(done)
        text = f"sweep: {len(done)} of {len(self.jobs)} jobs done in {duration(elapsed)}"
        if left is None or len(done) >= len(self.jobs):
            return text
        eta = time.strftime("%H:%M", time.localtime(time.time() + left))
        line = f"{text}; about {duration(left)} left (ETA {eta})"
        if len(self.ended) == 1 and elapsed + left > LONG_S and \
                sum(e.seconds or 0 for e in self.estimates) <= LONG_S:
            line += "; " + self._long(elapsed + left)  # the first job told what no estimate did
        return line

    def _left(self, done: set[int]) -> float | None:
        """The remaining jobs' estimates, scaled by how the ended jobs' times compared with
        theirs; where none had one, the ended jobs' time per token (or per job)."""
        rest = [i for i in range(len(self.jobs)) if i not in done and not self.jobs[i].kept]
        if not rest:
            return 0.0
        ran = [(n, s) for n, s in self.ended if n < len(self.jobs)]
        pairs = [(s, self.estimates[n].seconds) for n, s in ran if self.estimates[n].seconds]
        ratio = sum(s for s, _ in pairs) / sum(e for _, e in pairs) if pairs else 1.0
        per_token = [(s, self.jobs[n].tokens) for n, s in ran if self.jobs[n].tokens]
        rate = sum(s for s, _ in per_token) / sum(t for _, t in per_token) if per_token else None
        per_job = sum(s for _, s in ran) / len(ran) if ran else None
        # A kind none of whose jobs has run yet still builds its engine once.
        left = sum(self.setups.get(k, 0.0) for k in {self.jobs[i].kind for i in rest}
                   if k not in self.paid)
        for i in rest:
            if (guess := self.estimates[i].seconds) is not None:
                left += guess * ratio
            elif rate is not None and self.jobs[i].tokens:
                left += rate * self.jobs[i].tokens
            elif per_job is not None:
                left += per_job
            else:
                return None
        return left
