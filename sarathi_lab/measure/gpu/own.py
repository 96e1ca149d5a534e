"""The suite on your own GPU (``--own``): the paper's setting, no budget, under outputs/; its
progress, a line per job or step with the time elapsed and left at this pace."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sarathi_lab.config import REPO_ROOT, device_slug
from sarathi_lab.harness.progress import progress_line
from sarathi_lab.harness.results import is_finished
from sarathi_lab.measure.gpu import state
from sarathi_lab.measure.gpu.plan import Step
from sarathi_lab.measure.gpu.steps.paper import job_overrides, sweep_dir

ROOT = REPO_ROOT / "outputs" / "paper_gpu"
DRY = "dry-run"
# How often the driver reads the out directory while a worker runs.
POLL_S = 5.0
QUIET_S = 600.0
# From a child: the driver never imports torch (a broken CUDA costs a step, not the run).
_PROBE = "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else '')"


def device_folder(dry_run: bool) -> str:
    """outputs/paper_gpu/'s folder: the chip or 'dry-run'; ValueError without a GPU."""
    if dry_run:
        return DRY
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                          check=False)
    name = (done.stdout.strip().splitlines() or [""])[-1] if done.returncode == 0 else ""
    if not name:
        raise ValueError("--own is invalid here: torch sees no CUDA GPU; --own --dry-run runs "
                         "every step on the CPU at tiny shapes")
    return device_slug(name)


def out_dir(out: Path | None, dry_run: bool) -> Path:
    """--out, else device_folder; a ValueError without a GPU, or for a folder inside docs/."""
    folder = device_folder(dry_run)
    out = out or ROOT / folder
    if out.resolve().is_relative_to((REPO_ROOT / "docs").resolve()):
        raise ValueError(f"--out={out} is invalid: --own writes outputs, never into docs/ (python "
                         "-m sarathi_lab.measure publish keeps results there, checking what it "
                         "would replace)")
    return out


class Stopped(Exception):
    """SIGTERM to the driver: stop the worker as on Ctrl-C."""


def start(out: Path, todo: list[Step], dry_run: bool) -> StepProgress:
    """Stop on SIGTERM as on Ctrl-C; returns the progress the driver prints."""
    def stop(signum, _frame):
        raise Stopped(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    watch = StepProgress(out, todo, dry_run)
    if todo:
        print(f"[own] {len(todo)} steps to run, {sum(s.minutes for s in todo):.0f} min expected by "
              "the plan; Ctrl-C stops, the same command resumes", flush=True)
    return watch


def finish(watch: StepProgress, out: Path) -> None:
    """The last progress lines, then what the folder holds, the claims and figures first."""
    figures = sorted((out / "figures").glob("*.png"))
    kept = [name for name in ("claims.md", "claims.csv", "summary.csv") if (out / name).is_file()]
    held = [f"results in {out}:", *(f"  {name}" for name in kept),
            f"  figures/: {len(figures)} ({', '.join(p.stem for p in figures) or 'none yet'})"]
    for line in [*watch.poll(), *(f"[own] {line}" for line in held)]:
        print(line)


def clock(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _job_key(overrides: list[str]) -> frozenset[str]:
    # hydra.* overrides are the sweep's, not the job's.
    return frozenset(o for o in overrides if not o.startswith("hydra."))


@dataclass
class StepJobs:
    """A pending step's jobs and how many were done when the run began."""
    step: Step
    keys: frozenset[frozenset[str]]   # its sweep's jobs (empty: not a sweep, or a dry run)
    at_start: int = 0

    @property
    def total(self) -> int:
        return max(1, len(self.keys))


@dataclass
class StepProgress:
    """An own run's steps and their sweeps' jobs, read from the out directory as the worker writes
    them: a line per job finished and step ended, with the time elapsed and left at this pace."""
    out: Path
    steps: list[Step]
    dry_run: bool
    started: float = field(default_factory=time.time)
    _jobs: dict[str, StepJobs] = field(default_factory=dict, init=False)
    _seen: dict[Path, frozenset[str] | None] = field(default_factory=dict, init=False, repr=False)
    _last: dict[str, tuple[str | None, int]] = field(default_factory=dict, init=False)
    _said_at: float = field(default=0.0, init=False)

    def __post_init__(self):
        for s in self.steps:
            keys = (frozenset() if self.dry_run or s.group != "paper"
                    else frozenset(map(_job_key, job_overrides(s))))
            jobs = self._jobs[s.name] = StepJobs(s, keys)
            jobs.at_start = self.finished(jobs)
        self._said_at = self.started

    def _overrides(self, job_dir: Path) -> frozenset[str] | None:
        """A finished job folder's overrides (read once); None where unfinished."""
        if job_dir not in self._seen or self._seen[job_dir] is None:
            try:
                found = (yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text())
                         if is_finished(job_dir) else None)
            except (OSError, yaml.YAMLError):
                found = None
            self._seen[job_dir] = _job_key(found) if isinstance(found, list) else None
        return self._seen[job_dir]

    def settled(self, name: str) -> state.StepResult | None:
        """The step's result where this run wrote it."""
        result = state.read_result(self.out, name)
        return result if result is not None and result.started_at >= self.started else None

    def finished(self, jobs: StepJobs) -> int:
        if state.is_done(self.out, jobs.step.name):
            return jobs.total
        if not jobs.keys:
            return 0
        folder = sweep_dir(self.out, jobs.step.arg, self.dry_run)
        found = ({self._overrides(d) for d in folder.iterdir() if d.is_dir()} if folder.is_dir()
                 else set())
        return min(jobs.total, len(found & jobs.keys))

    def estimate(self, now: float) -> tuple[float, float]:
        """(share of this run's work done, seconds left); a step ended undone leaves the plan."""
        done_s = left_s = 0.0
        for jobs in self._jobs.values():
            result = self.settled(jobs.step.name)
            if result is not None and result.status != "done":
                continue
            share = jobs.step.minutes * 60 / jobs.total
            finished = jobs.total if result is not None else self.finished(jobs)
            done_s += share * max(0, finished - jobs.at_start)
            left_s += share * (jobs.total - finished)
        # What the work done took against the plan's estimate of it.
        rate = (now - self.started) / done_s if done_s > 0 else 1.0
        total = done_s + left_s
        return (done_s / total if total else 1.0), left_s * rate

    def poll(self, now: float | None = None) -> list[str]:
        """A line per job finished and step ended since the last poll, or a step silent for long."""
        now = time.time() if now is None else now
        results = {n: self.settled(n) for n in self._jobs}
        counts = {n: self.finished(j) for n, j in self._jobs.items()}
        news: list[tuple[str, bool]] = []
        for name, jobs in self._jobs.items():
            before_status, before_count = self._last.get(name, (None, jobs.at_start))
            status = results[name] and results[name].status
            if jobs.keys:
                news += [(f"{name}: {k} of {jobs.total} jobs finished", False)
                         for k in range(before_count + 1, counts[name] + 1)]
            if status and not before_status:
                news.append((f"{name}: {status} in {results[name].seconds:.0f} s", True))
            self._last[name] = (status, counts[name])
        if not news and now - self._said_at >= QUIET_S:
            running = [n for n in self._jobs if results[n] is None
                       and state.started_at(self.out, n) is not None]
            news = [(f"{n}: {counts[n]} of {self._jobs[n].total} jobs finished, running", False)
                    for n in running[:1]]
        if not news:
            return []
        self._said_at = now
        fraction, left = self.estimate(now)
        lines, ended = [], sum(r is not None for r in results.values()) - sum(e for _, e in news)
        for what, ends in news:
            ended += ends
            lines.append("[own] " + progress_line(
                f"{clock(now - self.started)} elapsed, about {clock(left)} left ({fraction:.0%} "
                "of this run's work done)", what, f"{ended} of {len(self._jobs)} steps ended"))
        return lines
