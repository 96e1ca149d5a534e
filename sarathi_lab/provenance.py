"""What a kept result file came from (its nearest ``provenance.json`` sidecar), and the check every
writer into docs/ and profiles/ makes: a file of another source, scale, machine, lease or commit is
replaced only with ``--force``. Standard library only."""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from contextlib import suppress
from dataclasses import asdict, dataclass, fields
from pathlib import Path

SIDECAR = "provenance.json"
EVERYTHING = "*"  # a sidecar's key for every file under its folder
UNRECORDED = "unrecorded"
SHOWN = 3


@dataclass(frozen=True)
class Provenance:
    """Every field but ``writer`` must match to replace a file unasked; '' where none applies."""
    source: str  # 'measured CPU', 'measured GPU', 'simulated H200 (profile)', 'computed' ...
    scale: str = ""  # a paper sweep's scale ('full' or 'ci'), or the size a benchmark ran at
    machine: str = ""
    lease: str = ""  # a GPU lease, '<date>_<commit>' (measure/gpu/collect.py)
    commit: str = ""  # the runs' commit(s), '+'-joined; UNRECORDED where a run had none
    writer: str = ""  # the command that wrote it: said, not compared

    def key(self) -> tuple[str, ...]:
        return tuple(getattr(self, f.name) for f in fields(self) if f.name != "writer")

    def describe(self) -> str:
        parts = [self.source, self.scale and f"{self.scale} scale", self.machine,
                 self.lease and f"lease {self.lease}", self.commit and f"commit {self.commit}"]
        return ", ".join(p for p in parts if p)


def commits(values: Iterable[str | None]) -> str:
    found = {UNRECORDED if v is None or str(v) in ("", "nan", "None") else str(v)[:7]
             for v in values}
    return "+".join(sorted(found))


def _read(sidecar: Path) -> dict[str, Provenance]:
    try:
        entries = json.loads(sidecar.read_text())
        known = {f.name for f in fields(Provenance)}
        return {name: Provenance(**{k: str(v) for k, v in entry.items() if k in known})
                for name, entry in entries.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}  # unreadable: nothing under it is replaced unasked


def recorded(path: Path) -> Provenance | None:
    path = Path(path).absolute()
    for folder in path.parents:
        sidecar = folder / SIDECAR
        if sidecar.is_file():
            entries = _read(sidecar)
            return entries.get(path.relative_to(folder).as_posix(), entries.get(EVERYTHING))
    return None


@dataclass(frozen=True)
class Conflict:
    path: Path
    old: Provenance | None
    new: Provenance

    def describe(self, base: Path | None = None) -> str:
        inside = base is not None and self.path.is_relative_to(base)
        name = self.path.relative_to(base) if inside else self.path
        old = ("unknown provenance (no provenance.json names it)" if self.old is None
               else self.old.describe())
        return f"{name} ({old}; new: {self.new.describe()})"


def conflicts(planned: Mapping[Path, Provenance]) -> list[Conflict]:
    """Existing files not known to be of the new provenance (an UNRECORDED commit matches none)."""
    found = []
    for path, new in planned.items():
        if Path(path).is_file() and ((old := recorded(path)) is None
                                     or old.key() != new.key()
                                     or UNRECORDED in old.commit.split("+")):
            found.append(Conflict(Path(path), old, new))
    return found


class ReplaceRefused(ValueError):
    """A writer would replace files of another provenance unasked."""


def refusal(found: list[Conflict], how: str, base: Path | None = None) -> str:
    shown = "; ".join(c.describe(base) for c in found[:SHOWN])
    more = f"; and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    return (f"would replace {len(found)} file(s) of another source, scale, machine, lease or "
            f"commit: {shown}{more}. {how}")



class SidecarRefused(ReplaceRefused):
    """Even ``--force`` could not record what it wrote, so nothing is written."""


def unwritable_sidecar(folders: Iterable[Path]) -> Path | None:
    for folder in folders:
        sidecar = Path(folder) / SIDECAR
        if sidecar.is_symlink() or (sidecar.exists() and not sidecar.is_file()):
            return sidecar
    return None


def check(planned: Mapping[Path, Provenance], force: bool, how: str,
          base: Path | None = None) -> None:
    """Refuses before anything is written; ``how``: the writer's way out."""
    if bad := unwritable_sidecar(dict.fromkeys(Path(p).parent for p in planned)):
        raise SidecarRefused(f"{bad} is not a plain file (a folder, link or other), so the "
                             "provenance of what would be written beside it cannot be recorded; "
                             "nothing was written; remove it")
    if not force and (found := conflicts(planned)):
        raise ReplaceRefused(refusal(found, how, base))


def record(written: Mapping[Path, Provenance]) -> None:
    by_folder: dict[Path, dict[str, Provenance]] = {}
    for path, prov in written.items():
        path = Path(path)
        by_folder.setdefault(path.parent, {})[path.name] = prov
    for folder, entries in by_folder.items():
        record_folder(folder, entries)


def sidecar_text(folder: Path, entries: Mapping[str, Provenance]) -> str:
    """For a writer that writes all its files at once."""
    sidecar = Path(folder) / SIDECAR
    merged = {name: asdict(p) for name, p in _read(sidecar).items()} if sidecar.is_file() else {}
    merged |= {name: asdict(p) for name, p in entries.items()}
    return json.dumps(dict(sorted(merged.items())), indent=1) + "\n"


def record_folder(folder: Path, entries: Mapping[str, Provenance]) -> Path:
    sidecar = Path(folder) / SIDECAR
    text = sidecar_text(folder, entries)
    sidecar.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=sidecar.parent, prefix=f".{SIDECAR}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, sidecar)
    finally:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
    return sidecar


def check_or_refuse(parser, planned: Mapping[Path, Provenance], force: bool, how: str) -> None:

    try:
        check(planned, force, how)
    except ReplaceRefused as e:
        parser.error(str(e))
