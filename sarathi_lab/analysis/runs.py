"""Each experiment's runs under a results root: newest complete sweep, else newest, marked so."""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from sarathi_lab import provenance
from sarathi_lab.analysis import registry
from sarathi_lab.analysis.claims import simulated_provenance
from sarathi_lab.env_flags import env_flag
from sarathi_lab.executors import recorded_as
from sarathi_lab.harness.results import (
    METRICS,
    SWEEP_SUMMARY,
    UnreadableRun,
    current_names,
    is_read,
    load_runs,
    natural_order,
    read_json,
    read_record,
    run_source,
)
from sarathi_lab.harness.sweep_state import SweepState, sweep_state

log = logging.getLogger(__name__)

EXPERIMENTS = registry.names()


def sweeps(root: str | Path, name: str) -> list[Path]:
    """Sweeps under ``root/<name>/multiruns`` holding a finished run, newest first."""
    finished = {}
    for metrics in (Path(root) / name / "multiruns").glob(f"*/**/{METRICS}"):
        relative = metrics.relative_to(Path(root) / name / "multiruns")
        if is_read(relative):  # not W&B's copy, nor a run set aside
            finished[relative.parts[0]] = max(finished.get(relative.parts[0], 0.0),
                                              metrics.stat().st_mtime)
    return [Path(root) / name / "multiruns" / s
            for s in sorted(finished, key=finished.get, reverse=True)]


# Truthy (env_flags.py): every Results reads incomplete sweeps as include_incomplete does.
INCLUDE_INCOMPLETE_ENV = "SARATHI_INCLUDE_INCOMPLETE"
# Truthy: the notebooks keep runs flagged timing_unreliable.
INCLUDE_UNRELIABLE_ENV = "SARATHI_INCLUDE_UNRELIABLE"


@dataclass(frozen=True)
class Choice:
    """The sweep standing for an experiment, its state, and newer incomplete sweeps passed over."""
    sweep: Path
    state: SweepState
    skipped: list[tuple[Path, SweepState]]

    def note(self, kept: bool) -> str:
        """'' for a complete sweep; else what the numbers lack or passed over."""
        if not self.state.complete:
            return (f"incomplete: {self.state.describe()}"
                    + (" (include_incomplete)" if kept else ""))
        if not self.skipped:
            return ""
        newest, state = self.skipped[0]
        more = f" and {len(self.skipped) - 1} older" if len(self.skipped) > 1 else ""
        return (f"newer incomplete sweep {newest.name}{more} skipped ({state.describe()}; "
                "include_incomplete judges it)")


def download_wandb(project: str, root: str | Path, names=None) -> Path:
    """Each experiment's newest W&B group into ``root``, laid out as local runs."""
    import wandb

    api = wandb.Api()
    for name in names or registry.names():
        runs = list(api.runs(project, filters={"jobType": name}, order="-created_at"))
        if not runs:
            continue
        group = runs[0].group or runs[0].id
        for run in (r for r in runs if (r.group or r.id) == group):
            dest = Path(root) / name / "multiruns" / group / run.id
            for f in run.files():
                if f.name == METRICS or f.name.endswith(".parquet"):
                    f.download(root=str(dest), replace=True)
    return Path(root)


# The units a metric's name ends with (else a count, flag or setting).
METRIC_UNITS = ("_s", "_tok_s", "_rps", "_tokens", "_share", "_fraction")
# A run whose times other work distorted (host_load.py).
UNRELIABLE = "env.timing_unreliable"


@dataclass(eq=False)
class Results:
    """Each experiment's runs under a root, loaded on use; unreliable ones out unless asked."""
    root: Path
    include_unreliable: bool = False
    seed: int | None = None
    include_incomplete: bool | None = None
    _tables: dict[tuple[str, str], pd.DataFrame] = field(default_factory=dict, repr=False)
    _choices: dict[str, Choice] = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self.root = Path(self.root)
        if self.include_incomplete is None:
            self.include_incomplete = env_flag(INCLUDE_INCOMPLETE_ENV)

    @classmethod
    def of_sweep(cls, sweep_dir: str | Path, name: str) -> Results:
        """One sweep's runs as ``name``'s, wherever it lies, every run kept: its own report's view
        (its table says which runs were unreliable or unfinished)."""
        sweep_dir = Path(sweep_dir)
        results = cls(sweep_dir.parent, include_unreliable=True, include_incomplete=True)
        results._choices[name] = Choice(sweep_dir, sweep_state(sweep_dir), [])
        return results

    def choice(self, name: str) -> Choice:
        """The newest complete sweep, else (``include_incomplete`` or none complete) the newest."""
        if name not in self._choices:
            found = sweeps(self.root, name)
            if not found:
                raise FileNotFoundError(f"no finished run of {name} under {self.root}")
            states = []
            for sweep in found:
                states.append((sweep, sweep_state(sweep)))
                if self.include_incomplete or states[-1][1].complete:
                    self._choices[name] = Choice(*states[-1], states[:-1])
                    break
            else:
                self._choices[name] = Choice(*states[0], [])
        return self._choices[name]

    def sweep(self, name: str) -> Path:
        return self.choice(name).sweep

    def sweep_note(self, name: str) -> str:
        """'incomplete: 2 of 4 jobs finished; ...', or the newer incomplete sweep passed, or ''."""
        return self.choice(name).note(self.include_incomplete)

    def missing(self) -> list[str]:
        return [n for n in registry.names() if not sweeps(self.root, n)]

    def summary(self, name: str) -> pd.DataFrame:
        return self.table(name, "summary")

    def _loaded(self, name: str, table: str) -> pd.DataFrame:
        if (name, table) not in self._tables:
            runs = load_runs(self.sweep(name), table=table)
            self._tables[name, table] = self._current_jobs(name, runs, warn=table == "summary")
        return self._tables[name, table]

    def _current_jobs(self, name: str, runs: pd.DataFrame, warn: bool) -> pd.DataFrame:
        """``runs`` of the jobs the sweep's last launch ran; earlier ones' left out, and said."""
        sweep, state = self.sweep(name), self.choice(name).state
        if (not len(runs) or not state.ended
                or not isinstance(read_json(sweep / SWEEP_SUMMARY), dict)):
            return runs  # no launch's report says which jobs are the sweep's: its folders are
        relative = runs.run_dir.map(lambda d: Path(d).relative_to(sweep).as_posix())
        current = relative.map(lambda r: any(r == job or r.startswith(f"{job}/")
                                             for job in state.jobs))
        if warn and (other := sorted(set(relative[~current]),
                                     key=lambda r: natural_order(Path(r)))):
            log.warning("%s: %d run%s under %s left out: of none of the jobs its last launch ran "
                        "(%s)", name, len(other), "s" * (len(other) != 1), sweep,
                        ", ".join(other[:5]) + (" ..." if len(other) > 5 else ""))
        return runs[current].reset_index(drop=True)

    def _unreliable_runs(self, name: str) -> set[str]:
        summary = self._loaded(name, "summary")
        if UNRELIABLE not in summary:
            return set()
        return set(summary.run_dir[summary[UNRELIABLE].fillna(False).astype(bool)])

    def _runs(self, name: str) -> set[str]:
        """The run_dirs kept: reliable (unless opted in), of ``seed`` if set."""
        summary = self._loaded(name, "summary")
        keep = set(summary.run_dir)
        if not self.include_unreliable:
            keep -= self._unreliable_runs(name)
        if self.seed is not None and "seed" in summary:
            keep &= set(summary.run_dir[summary.seed == self.seed])
        return keep

    def table(self, name: str, table: str) -> pd.DataFrame:
        loaded = self._loaded(name, table)
        if not len(loaded):
            return loaded
        return loaded[loaded.run_dir.isin(self._runs(name))].reset_index(drop=True)

    def seeds(self, name: str) -> list[int]:
        """The seeds of the kept runs, each a repeat of the whole experiment."""
        summary = self.summary(name)
        return sorted(summary.seed.dropna().unique().tolist()) if "seed" in summary else []

    def repeat(self, seed: int) -> Results:
        return replace(self, seed=seed)

    def with_unreliable(self) -> Results:
        return replace(self, include_unreliable=True)

    def provenance(self, name: str) -> dict[str, str]:
        """A claims row's claims.PROVENANCE columns."""
        row = self._loaded(name, "summary").iloc[0]
        source = f"{self.source(name)}, {row.get('model', 'unrecorded')}"
        scale, dtype = self.scale(name), str(row.get("env.dtype", ""))
        if recorded_as(self.executor(name)["executor"], "simulated"):
            return simulated_provenance(source, scale, dtype) | {"commit": self.commits(name)}
        threads = row.get("env.torch_threads")
        return {"source": source, "scale": scale, "dtype": dtype,
                "threads": "" if pd.isna(threads) else f"{threads:g}",
                "machine": str(row.get("env.device_name", "")), "commit": self.commits(name)}

    def commits(self, name: str) -> str:
        """'6218397', 'unrecorded', or 'mixed: 6218397 (3 runs), abcdef0 (1 run)'."""
        summary = self.summary(name)
        if summary.empty:
            summary = self._loaded(name, "summary")
        column = summary["env.git_commit"] if "env.git_commit" in summary else [None] * len(summary)
        counts = Counter(provenance.commits([value]) for value in column)
        if len(counts) <= 1:
            return next(iter(counts), provenance.UNRECORDED)
        return "mixed: " + ", ".join(f"{c} ({n} run{'s' * (n != 1)})"
                                     for c, n in sorted(counts.items()))

    def lacking_note(self, name: str, short: bool = False) -> str:
        """What the tables silently leave out; ``short``: without the reasons."""
        sweep, keys, unreadable = self.sweep(name), {}, []
        summary = self.summary(name)
        kept = set(summary.run_dir) if "run_dir" in summary else set()
        for path in sorted(sweep.rglob(METRICS), key=natural_order):
            if not is_read(path.relative_to(sweep)):
                continue
            try:
                summary = read_record(path)["summary"]
            except UnreadableRun:
                unreadable.append(path.parent.relative_to(sweep).as_posix())
                continue
            if str(path.parent) in kept:
                keys[str(path.parent)] = set(current_names(summary))
        # A run inside another (a capacity search's trials) records other metrics than its own.
        keys = {run: k for run, k in keys.items()
                if not any(str(parent) in keys for parent in Path(run).parents)}
        lacking = {}
        for metric in set().union(*keys.values()) if keys else ():
            if metric.endswith(METRIC_UNITS) and (
                    missing := sum(metric not in k for k in keys.values())):
                lacking.setdefault(missing, []).append(metric)
        notes = [f"{len(unreadable)} run{'s' * (len(unreadable) != 1)} unreadable"
                 + ("" if short
                    else f" ({', '.join(unreadable[:3])}{' ...' if len(unreadable) > 3 else ''}): "
                    "left out")] if unreadable else []
        for missing, metrics in sorted(lacking.items()):
            names = ", ".join(sorted(metrics)[:4]) + (" ..." if len(metrics) > 4 else "")
            notes.append(f"{missing} of {len(keys)} run{'s' * (len(keys) != 1)} lack {names}" + (
                "" if short else (" (renamed, or recorded by another "
                                  "version): left out of what reads it")))
        return "; ".join(notes)

    def scale(self, name: str) -> str:
        """'ci' or 'full': the runs' own ``scale``, or a ``ci-*`` sweep folder."""
        summary = self._loaded(name, "summary")
        recorded = set(summary["scale"].dropna()) if "scale" in summary else set()
        return "ci" if "ci" in recorded or self.sweep(name).name.startswith("ci-") else "full"

    def executor(self, name: str) -> dict[str, str]:
        """``executor`` and, simulated, its sim_* settings."""
        engine = {}
        sweep = self.sweep(name)
        for metrics in sorted(sweep.glob(f"*/**/{METRICS}")):
            if not is_read(metrics.relative_to(sweep)):
                continue
            try:
                engine = read_record(metrics)["resolved_config"].get("engine", {})
                break
            except UnreadableRun as e:
                log.warning("%s; left out", e)
        if not recorded_as(engine.get("executor"), "simulated"):
            return {"executor": engine.get("executor", "model")}
        stages = {"sim_pp": engine["sim_pp"]} if engine.get("sim_pp", 1) > 1 else {}
        return {"executor": engine["executor"],
                "sim_device": engine.get("sim_device", "unrecorded"),
                "sim_cost_model": engine.get("sim_cost_model", "unrecorded"),
                "sim_tp": engine.get("sim_tp", 1), **stages}

    def source(self, name: str) -> str:
        """'measured CPU', 'measured GPU' or e.g. 'simulated A6000 (roofline)'."""
        return run_source(self.executor(name),
                          str(self._loaded(name, "summary").iloc[0].get("env.device", "")))

    def describe(self, name: str) -> str:
        """Figure titles: e.g. 'measured CPU: cpu-small, AMD EPYC, float32 (full scale)'."""
        row = self._loaded(name, "summary").iloc[0]
        where = ("predicted by the cost model, not measured"
                 if recorded_as(self.executor(name)["executor"], "simulated")
                 else row.get("env.device_name", "unrecorded device"))
        commits = self.commits(name)
        mixed = (f"runs of {commits.removeprefix('mixed: ')}" if commits.startswith("mixed: ")
                 else "")
        lacking = self.lacking_note(name, short=True) if hasattr(self, "lacking_note") else ""
        notes = "".join(f"; {note}" for note in (self.sweep_note(name), self.unreliable_note(name),
                                                 lacking, mixed) if note)
        return (f"{self.source(name)}: {row.get('model', 'unrecorded')}, {where}, "
                f"{row.get('env.dtype', 'unrecorded')} ({self.scale(name)} scale{notes})")

    def nothing_kept_note(self, name: str) -> str:
        """Stands in for a figure with no kept run: how many left out, why, how to draw them."""
        flagged = len(self._unreliable_runs(name))
        if not flagged:
            unreadable = self.lacking_note(name)
            return (f"no run of {name} to draw under {self.sweep(name)}"
                    + (f": {unreadable}" if unreadable else ""))
        return (f"no reliable run of {name}: {flagged} run{'s' * (flagged != 1)} left out as "
                f"timing_unreliable; set {INCLUDE_UNRELIABLE_ENV}=1 to draw them anyway")

    def unreliable_note(self, name: str) -> str:
        """'3 of 8 runs left out: timing unreliable' (or kept), '' when none is flagged."""
        flagged = len(self._unreliable_runs(name))
        if not flagged:
            return ""
        total = len(self._loaded(name, "summary"))
        return (f"{flagged} of {total} runs timing unreliable, kept" if self.include_unreliable
                else f"{flagged} of {total} runs left out: timing unreliable")


def load_results(root: str | Path, wandb_project: str | None = None,
                 include_unreliable: bool = False,
                 include_incomplete: bool | None = None) -> Results:
    """The runs of every experiment under ``root``, ``wandb_project`` downloaded there first."""
    if wandb_project:
        folder = Path(root) / "wandb" / wandb_project.replace("/", "__")
        root = download_wandb(wandb_project, folder)
    return Results(root, include_unreliable, include_incomplete=include_incomplete)
