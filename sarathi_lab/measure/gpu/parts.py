"""A paper step's time in its parts, as its sweep left them: its set-up (Hydra, the sweep's checks
of every job, and where it ran first in its process the interpreter and the imports: the step's
seconds before its first job began and after its last ended, read from sweep.log) and each job's
seconds (its launch to the next's), with, from its run folder, the run's own seconds
(metrics.json's wall_time_s), its graph capture and what its engine built. A step writes its jobs'
rows as steps/<step>/jobs.csv; a lease collected before that keeps them beside its folder as
<lease>.jobs.csv (``python -m sarathi_lab.measure gpu_parts ARCHIVE``). The queue plans each step
from these (queue.py)."""
from __future__ import annotations

import csv
import io
import json
import re
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sarathi_lab.analysis import gpu_records

SWEEP_LOG, JOBS_CSV = "sweep.log", "jobs.csv"
BESIDE = "jobs.csv"  # <lease>.jobs.csv, for a lease collected before its steps wrote theirs
COLUMNS = ("step", "job", "run_s", "capture_s", "engine_setup_s", "engine")
_STAMP = r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]"
LAUNCHING = re.compile(_STAMP + r"\[HYDRA\] Launching \d+ jobs")
JOB_START = re.compile(_STAMP + r"\[HYDRA\] \t#(?P<num>\d+) : ")
JOB_RESULTS = re.compile(_STAMP + r"\[sarathi_lab\.harness\.runner\]\[INFO\] - results in ")
STAMPED = re.compile(_STAMP)
AS_MEASURED = "jobs as measured, a build each"


@dataclass(frozen=True)
class Job:
    num: int
    span_s: float  # from its launch to the next job's (the last: to the log's last line)
    ran: bool      # False: kept from an earlier call (on_existing), failed or stopped
    run_s: float | None = None      # the run's own seconds (metrics.json's wall_time_s)
    capture_s: float | None = None  # the CUDA graphs this job captured (None: none, or unknown)
    engine: str = ""                # its model: built, re-seeded, reused ("": not recorded)


@dataclass(frozen=True)
class StepParts:
    step: str
    where: str      # "<device> <lease>"
    setup_s: float  # the step's seconds outside its jobs
    jobs: tuple[Job, ...]


@dataclass(frozen=True)
class Estimate:
    """A step's expected seconds in parts: ``setup_s`` once, ``jobs`` of ``job_s``, and
    ``capture_s`` for the graph sets its jobs capture; ``process_s``: the set-up of the process
    it shares with the steps after it, which the first of them pays (process_groups.py)."""
    setup_s: float
    jobs: int
    job_s: float
    capture_s: float
    source: str  # where the parts were measured, or "planned"
    process_s: float = 0.0

    @property
    def seconds(self) -> float:
        return self.process_s + self.setup_s + self.jobs * self.job_s + self.capture_s

    def minutes(self, margin: float) -> float:
        return round(margin * self.seconds / 60, 1) or 0.1

    def shown(self) -> str:
        captures = f" + captures {self.capture_s:.0f} s" if self.capture_s >= 0.5 else ""
        process = f"process set-up {self.process_s:.0f} s + " if self.process_s >= 0.5 else ""
        return (f"{process}set-up {self.setup_s:.0f} s + {self.jobs} jobs x {self.job_s:.1f} s"
                f"{captures} ({self.source})")


def estimate(parts: StepParts, jobs: int, graph_sets: int) -> Estimate | None:
    """``jobs`` of the step's grid today, from a lease's parts. Where the runs' seconds were kept,
    a job is its run plus the least time any job spent outside its run and captures (on a shared
    engine that holds no build; measured before one, it holds a build: an upper bound), the set-up
    holds one build more, and ``graph_sets`` captures of the jobs' mean; else a job is its measured
    span, builds and captures in it."""
    ran = [j for j in parts.jobs if j.ran]
    if not ran:
        return None
    timed = [j for j in ran if j.run_s is not None]
    if not timed:
        return Estimate(parts.setup_s, jobs, sum(j.span_s for j in ran) / len(ran), 0.0,
                        f"{parts.where}, {AS_MEASURED}")
    outside = max(0.0, min(j.span_s - j.run_s - (j.capture_s or 0.0) for j in timed))
    run = sum(j.run_s for j in timed) / len(timed)
    captured = [j.capture_s for j in timed if j.capture_s]
    capture = graph_sets * sum(captured) / len(captured) if captured else 0.0
    shared = any(j.engine in ("reused", "re-seeded") for j in timed)
    how = "on a shared engine" if shared else "its runs, one build"
    return Estimate(parts.setup_s + outside, jobs, run + outside, capture, f"{parts.where}, {how}")


def _seconds(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def sweep_spans(log: str) -> tuple[list[tuple[int, float, bool]], float] | None:
    """The last launch's jobs as (number, seconds, ran) and the seconds from its first job's start
    to the log's last line; None where no job started."""
    lines = log.splitlines()
    starts = [i for i, line in enumerate(lines) if LAUNCHING.match(line)]
    lines = lines[starts[-1]:] if starts else lines
    jobs = [(i, int(m["num"]), _seconds(m["ts"])) for i, line in enumerate(lines)
            if (m := JOB_START.match(line))]
    if not jobs:
        return None
    last = max(_seconds(m["ts"]) for line in lines if (m := STAMPED.match(line)))
    out = []
    for k, (i, num, start) in enumerate(jobs):
        end_line, end = (jobs[k + 1][0], jobs[k + 1][2]) if k + 1 < len(jobs) \
            else (len(lines), last)
        ran = any(JOB_RESULTS.match(line) for line in lines[i:end_line])
        out.append((num, end - start, ran))
    return out, last - jobs[0][2]


def step_parts(step: str, where: str, seconds: float, log: str,
               rows: dict[int, dict[str, str]]) -> StepParts | None:
    """``rows``: jobs.csv's rows of this step by job number."""
    spans = sweep_spans(log)
    if spans is None:
        return None
    jobs, covered = spans
    return StepParts(step, where, max(0.0, seconds - covered), tuple(
        Job(num, span, ran, _number(rows.get(num, {}).get("run_s")),
            _number(rows.get(num, {}).get("capture_s")), rows.get(num, {}).get("engine", ""))
        for num, span, ran in jobs))


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def job_row(step: str, num: int, record: dict) -> dict[str, object]:
    """A run's metrics.json as a jobs.csv row."""
    env = record.get("environment") or {}
    graphs, setup = env.get("cuda_graphs"), env.get("engine_setup") or {}
    captured = isinstance(graphs, dict) and not graphs.get("kept")
    return {"step": step, "job": num, "run_s": _round(record.get("wall_time_s")),
            "capture_s": _round(graphs.get("capture_s")) if captured else "",
            "engine_setup_s": _round(setup.get("seconds")),
            "engine": (setup.get("parts") or {}).get("model", "")}


def _round(value) -> object:
    return round(value, 3) if isinstance(value, (int, float)) else ""


def job_number(folder: str) -> int | None:
    head = folder.split("_", 1)[0]
    return int(head) if head.isdigit() else None


def sweep_rows(step: str, sweep_dir: Path, jobs: list[str]) -> list[dict[str, object]]:
    """The finished ones of a sweep's ``jobs`` (its summary's folder names), in job order."""
    rows = []
    for job in jobs:
        metrics = sweep_dir / job / "metrics.json"
        if (num := job_number(job)) is not None and metrics.is_file():
            rows.append(job_row(step, num, json.loads(metrics.read_text())))
    return sorted(rows, key=lambda r: r["job"])


def write_rows(path: Path, rows: list[dict[str, object]]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(buffer.getvalue())


def read_rows(path: Path) -> dict[str, dict[int, dict[str, str]]]:
    """{step: {job: row}}; {} where absent or unreadable."""
    try:
        text = gpu_records.read_bytes(path).decode()
    except (gpu_records.RecordError, UnicodeDecodeError):
        return {}
    found: dict[str, dict[int, dict[str, str]]] = {}
    for row in csv.DictReader(io.StringIO(text)):
        if (num := _number(row.get("job"))) is not None and row.get("step"):
            found.setdefault(row["step"], {})[int(num)] = row
    return found


def lease_parts(folder: Path, summary: gpu_records.Summary) -> list[StepParts]:
    """A kept lease's paper steps in parts (those whose sweep.log holds a job)."""
    where = f"{folder.parent.name} {folder.name}"
    beside = read_rows(gpu_records.beside(folder, BESIDE))
    found = []
    for result in summary.steps:
        log = folder / "steps" / result.step / SWEEP_LOG
        if not result.step.startswith("paper.") or not log.is_file():
            continue
        rows = read_rows(log.parent / JOBS_CSV).get(result.step) or beside.get(result.step, {})
        text = gpu_records.read_bytes(log).decode(errors="replace")
        if parts := step_parts(result.step, where, result.seconds, text, rows):
            found.append(parts)
    return found


def main(argv: list[str] | None = None) -> int:
    """``ARCHIVE [--root DIR]``: an archive's paper jobs into its kept lease's <lease>.jobs.csv."""
    from sarathi_lab.config import REPO_ROOT
    from sarathi_lab.measure.gpu import archive_members, collect

    args = sys.argv[1:] if argv is None else argv
    if not args or args[0].startswith("-"):
        print(main.__doc__, file=sys.stderr)
        return 2
    archive, root = Path(args[0]), Path(args[args.index("--root") + 1]) if "--root" in args \
        else REPO_ROOT
    label = str(archive)
    with archive_members.open_archive(archive, label) as (tar, members):
        summary = archive_members.read_summary(tar, members, label)
        device, _ = collect.device_of(tar, members, label)
        rows = []
        for name, member in members.items():
            num = job_number(Path(name).parent.name)
            if (m := collect.RUN.match(name)) and num is not None:
                record = json.loads(archive_members.read_member(tar, member, label))
                rows.append(job_row(f"paper.{m[1]}", num, record))
    folder = collect.gpu_docs(root) / device / collect.lease_of(summary)
    path = gpu_records.beside(folder, BESIDE)
    write_rows(path, sorted(rows, key=lambda r: (r["step"], r["job"])))
    print(f"{len(rows)} jobs' parts: {path}")
    return 0
