"""A sweep directory's jobs, and the flock on SWEEP_LOCK by which a live sweep holds it."""
from __future__ import annotations

import errno
import json
import math
import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sarathi_lab.harness.results import (
    STATUS,
    SWEEP_SUMMARY,
    WANDB_DIR,
    is_finished,
    lock,
    natural_order,
    read_json,
)

SWEEP_LOCK = ".sweep.lock"
# Where a rerun that left every job as it was puts its report.
NEXT_SUMMARY = f".{Path(SWEEP_SUMMARY).stem}.next.json"


class SweepDirInUse(Exception):
    pass


class LockRefused(SweepDirInUse):
    """The lock cannot be taken (a directory, a link, unwritable, not a plain file)."""


# A link is never followed (it could aim the record at any file the user can write), and no
# O_TRUNC: the file is emptied only once known to be this directory's own plain file.
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
# Bounds what reading a lock record can cost (a record is a line of JSON).
_MAX_RECORD_BYTES = 1 << 16


def hold(sweep_dir: Path, jobs: int | None) -> int | None:
    """The lock's fd (close it to release); None where the filesystem has no locks."""
    path = sweep_dir / SWEEP_LOCK
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        fd = lock(path, _LOCK_FLAGS)
    except BlockingIOError:
        holder = _holder(read_lock_record(path))
        raise SweepDirInUse(f"hydra.sweep.dir={sweep_dir} is in use by another sweep ({holder}): "
                            "two sweeps into one directory overwrite each other's reports; give "
                            "this one its own hydra.sweep.dir, or rerun it there once the other "
                            "has ended") from None
    except OSError as e:
        raise LockRefused(_unlockable(sweep_dir, path, e)) from None
    if fd is None:
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        what = ("not a plain file" if not stat.S_ISREG(info.st_mode)
                else f"a file with {info.st_nlink} links")
        raise LockRefused(f"hydra.sweep.dir={sweep_dir} cannot be locked: {path} is {what}; "
                          "remove it (the sweep writes its own), or give this sweep another "
                          "hydra.sweep.dir")
    os.set_blocking(fd, True)
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
              "jobs": jobs}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
    return fd


def _unlockable(sweep_dir: Path, path: Path, e: OSError) -> str:
    if not sweep_dir.is_dir():
        return (f"hydra.sweep.dir={sweep_dir} is invalid: it (or a folder above it) is not a "
                f"directory ({e.strerror or e}); give the sweep a directory")
    if path.is_symlink():
        why = "is a symbolic link (never followed)"
    elif path.is_dir():
        why = "is a directory"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        why = f"cannot be written ({e.strerror})"
    else:
        why = f"cannot be opened ({e.strerror or e})"
    return (f"hydra.sweep.dir={sweep_dir} cannot be locked: {path} {why}; a sweep runs only "
            "holding its directory; remove it, or give this sweep another hydra.sweep.dir")


def read_lock_record(path: Path) -> dict[str, Any] | None:
    """None unless a plain file: never following a link or waiting on a FIFO, bytes bounded."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        record = json.loads(os.read(fd, _MAX_RECORD_BYTES))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return record if isinstance(record, dict) else None


def _holder(record: dict[str, Any] | None) -> str:
    if not record or "pid" not in record:
        return "its record is not written yet"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.get("started", 0)))
    return f"pid {record['pid']} on {record.get('host', '?')}, since {since}"


@dataclass(frozen=True)
class SweepState:
    jobs: tuple[str, ...]
    finished: tuple[str, ...]
    planned: int
    ended: bool                 # its launcher saw it to the end

    @property
    def complete(self) -> bool:
        return self.ended and len(self.finished) >= self.planned

    def describe(self) -> str:
        text = f"{len(self.finished)} of {self.planned} jobs finished"
        if not self.ended:
            return text + "; the sweep did not end (still running, or its launcher was stopped)"
        lacking = [job for job in self.jobs if job not in self.finished]
        more = f" and {len(lacking) - 5} more" if len(lacking) > 5 else ""
        return text + ("; left no run: " + ", ".join(lacking[:5]) + more if lacking else "")


def sweep_state(sweep_dir: Path) -> SweepState:
    launch = read_lock_record(sweep_dir / SWEEP_LOCK)
    summary = read_json(sweep_dir / SWEEP_SUMMARY, warn=True)
    reported_at = [p.stat().st_mtime for p in (sweep_dir / SWEEP_SUMMARY, sweep_dir / NEXT_SUMMARY)
                   if p.exists()]
    # A launch newer than every report has not ended: its summary is still to come.
    started = (launch or {}).get("started") or 0.0
    ended = ((launch is None and not reported_at)
             or max(reported_at, default=-math.inf) >= started - 1)

    jobs = list(summary) if ended and isinstance(summary, dict) else _job_folders(sweep_dir)
    planned = len(jobs) if ended else max(len(jobs), (launch or {}).get("jobs") or 0)
    finished = tuple(job for job in jobs if is_finished(sweep_dir / job))
    return SweepState(tuple(jobs), finished, planned, ended)


def _job_folders(sweep_dir: Path) -> list[str]:
    if not sweep_dir.is_dir():
        return []
    return [p.name for p in sorted(sweep_dir.iterdir(), key=natural_order)
            if p.is_dir() and not p.name.startswith(".") and p.name != WANDB_DIR
            and ((p / STATUS).exists() or is_finished(p))]
