"""The suite's out directory (steps/<step>/: result.json, DONE, files) and its export to $OUT."""
from __future__ import annotations

import csv
import json
import os
import shutil
import tarfile
import time
from contextlib import suppress
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sarathi_lab.analysis import gpu_records
from sarathi_lab.analysis.gpu_records import STATUSES, Metric, StepResult  # noqa: F401 (re-export)
from sarathi_lab.config import AS_WRITTEN, check_choice
from sarathi_lab.harness.results import write_atomically
from sarathi_lab.measure.gpu import archive_members
from sarathi_lab.measure.gpu.archive_members import MAX_FILE_BYTES

MAX_OUT_FILES = 8
ARCHIVE = "suite.tar.gz"
# What resuming reads: never left out of the archive.
RESUME_FILES = ("result.json", "DONE", "STARTED", "summary.json", "summary.csv")
# Figures copied into $OUT beside the archive, most telling first.
FIGURE_PRIORITY = ("kernels", "attention", "overhead", "per_token_cost", "decode_speedup",
                   "pd_ratio")


def step_dir(out: Path, name: str) -> Path:
    return out / "steps" / name


def is_done(out: Path, name: str) -> bool:
    return (step_dir(out, name) / "DONE").is_file()


def read_result(out: Path, name: str) -> StepResult | None:
    """The step's result.json; None where missing or (warned) not the suite's: due again."""
    path = step_dir(out, name) / "result.json"
    if not path.exists():
        return None
    try:
        result = gpu_records.read(path, gpu_records.step_result)
    except gpu_records.RecordError as e:
        gpu_records.warn(f"{e}; the step is taken as not run")
        return None
    if result.step != name:
        gpu_records.warn(f"{path} is invalid: step={result.step!r}: must be its folder's {name!r}; "
                         "the step is taken as not run")
        return None
    return result


def mark_started(out: Path, name: str) -> None:
    d = step_dir(out, name)
    d.mkdir(parents=True, exist_ok=True)
    (d / "DONE").unlink(missing_ok=True)
    (d / "STARTED").write_text(f"{time.time()}\n")


def started_at(out: Path, name: str) -> float | None:
    try:
        return float((step_dir(out, name) / "STARTED").read_text())
    except (OSError, ValueError):
        return None


def write_result(out: Path, result: StepResult) -> None:
    """The result, atomically; then, for a finished step, its done-marker."""
    check_choice("status", result.status, STATUSES, AS_WRITTEN)
    d = step_dir(out, result.step)
    d.mkdir(parents=True, exist_ok=True)
    text = json.dumps(asdict(result), indent=1, default=str)
    write_atomically(d / "result.json", lambda tmp: tmp.write_text(text))
    (d / "STARTED").unlink(missing_ok=True)
    if result.status == "done":
        (d / "DONE").write_text(f"{time.time()}\n")


def restore(out: Path, archive: Path) -> int:
    """An archive's files ``out`` lacks, never overwriting; a foreign archive refused first."""
    label = f"--restore={archive}"
    with archive_members.open_archive(archive, label) as (tar, members):
        planned = [(member, archive_members.inside(out, name,
                                                   f"{label} is invalid: member {name!r}"))
                   for name, member in members.items() if not member.isdir()]
        restored = 0
        for member, target in planned:
            if target.exists() or target.is_symlink():
                continue
            data = archive_members.read_member(tar, member, label)
            partial = target.with_name(f".{target.name}.restoring")
            try:
                out.mkdir(parents=True, exist_ok=True)
                target.parent.mkdir(parents=True, exist_ok=True)
                # a link left there is removed, never written through
                partial.unlink(missing_ok=True)
                fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                with os.fdopen(fd, "wb") as dst:
                    dst.write(data)
                os.replace(partial, target)
            except OSError as e:
                with suppress(OSError):
                    partial.unlink(missing_ok=True)
                raise ValueError(f"--out={out} is invalid: {target.relative_to(out.resolve())} "
                                 f"cannot be written there ({e.strerror or e}); {restored} "
                                 "files were restored before it") from None
            restored += 1
    return restored


def results(out: Path, names: list[str]) -> list[StepResult]:
    return [r for r in (read_result(out, n) for n in names) if r is not None]


def write_summary(out: Path, names: list[str], suite: dict[str, Any]) -> None:
    found = results(out, names)
    (out / "summary.json").write_text(json.dumps({"suite": suite,
                                                  "steps": [asdict(r) for r in found]},
                                                 indent=1, default=str))
    with open(out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["step", "metric", "value", "unit", "target", "holds", "note"])
        writer.writeheader()
        for r in found:
            writer.writerow({"step": r.step, "metric": "status", "value": r.status,
                             "note": r.error})
            writer.writerows({"step": r.step, **asdict(m), "note": ""} for m in r.metrics)


def archive(out: Path, dest: Path) -> list[str]:
    """One tar.gz; past 16 MiB (a common return limit) the largest go, never RESUME_FILES."""
    # Built in ``out``, not in $OUT: a call killed mid-build would leave a ninth file there.
    tmp = out / f"{ARCHIVE}.tmp"
    # Regular files only: restore refuses an archive with a link.
    files = [p for p in sorted(out.rglob("*")) if p.is_file() and not p.is_symlink()
             and p.name not in (ARCHIVE, tmp.name)]
    # Nor a file restore would refuse the whole archive for.
    notes = [f"{ARCHIVE}: {p.relative_to(out)} ({p.stat().st_size / 2**20:.1f} MiB) left out: over "
             "the 16 MiB a restored file may be" for p in files
             if p.stat().st_size > archive_members.MAX_FILE_BYTES]
    files = [p for p in files if p.stat().st_size <= archive_members.MAX_FILE_BYTES]

    def build(keep: list[Path]) -> int:
        try:
            with tarfile.open(tmp, "w:gz") as tar:
                for path in keep:
                    tar.add(path, arcname=str(path.relative_to(out)))
        except BaseException:
            tmp.unlink(missing_ok=True)  # no half archive left to be taken for one
            raise
        return tmp.stat().st_size

    if build(files) > MAX_FILE_BYTES:
        files = [p for p in files if "iterations" not in p.name]
        notes.append(f"{ARCHIVE}: per-iteration tables left out to stay under 16 MiB")
        droppable = sorted((p for p in files if p.name not in RESUME_FILES),
                           key=lambda p: p.stat().st_size)
        while build(files) > MAX_FILE_BYTES and droppable:
            largest = droppable.pop()
            files.remove(largest)
            notes.append(f"{ARCHIVE}: {largest.relative_to(out)} "
                         f"({largest.stat().st_size / 2**20:.1f} MiB) left out to stay under 16 "
                         "MiB: not brought back")
        if tmp.stat().st_size > MAX_FILE_BYTES:
            notes.append(f"{ARCHIVE}: over 16 MiB with its resume "
                         "files alone: a 16 MiB limit drops it")
    shutil.move(tmp, dest)  # out and $OUT may be on two file systems
    return notes


def export(out: Path, dest: Path | None) -> list[str]:
    """The summaries, claims, archive and first figures: at most MAX_OUT_FILES files in ``dest``."""
    if dest is None:
        return []
    dest.mkdir(parents=True, exist_ok=True)
    notes = archive(out, dest / ARCHIVE)
    files = [out / n for n in ("summary.json", "summary.csv", "claims.csv") if (out / n).is_file()]
    figures = sorted((out / "figures").glob("*.png"),
                     key=lambda p: (FIGURE_PRIORITY.index(p.stem) if p.stem in FIGURE_PRIORITY
                                    else 99, p.name))
    room = MAX_OUT_FILES - 1 - len(files)
    chosen = files + figures[:room]
    # An earlier export's other figures, left there, would pass the 8 files.
    for stale in set(dest.glob("*.png")) - {dest / p.name for p in chosen}:
        stale.unlink()
    for path in chosen:
        target = dest / path.name
        # Copied onto, a link would be written through: what $OUT gets is the suite's own file.
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.is_symlink() or (target.exists() and not target.is_file()):
            target.unlink()
        shutil.copyfile(path, target)
    if len(figures) > room:
        notes.append(f"$OUT holds {room} of {len(figures)} figures; all are in {ARCHIVE}")
    return notes
