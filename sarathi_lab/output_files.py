"""Where a measurement command writes: its outputs go into the one folder it was given (links
resolved), never into a collected lease's folder, nor over a file of another provenance unasked
(provenance.py). All is checked before the command's work (the folder can be made and written, its
disk has room, no name is a folder, a link or another command's file of this call), then written at
once: each file beside its name, then renamed over, so that a failure leaves no partial table.
A refusal is an OutputRefused, one line. Standard library only."""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from sarathi_lab import provenance

# A collected GPU lease's record (measure/gpu/collect.py): the folder holding it stays as collected.
COLLECTED = "lease.json"
# Less free than this and a command's tables could not all be written: refused before its work.
MIN_FREE_BYTES = 1 << 20
# Every path written in the call under way (one_call): two of its commands never share a file.
_written: set[Path] | None = None


class OutputRefused(ValueError):
    """Nothing was written; one line."""


@contextmanager
def one_call() -> Iterator[None]:
    """Several commands run as one call (``measure all``): none writes a file another wrote."""
    global _written
    outer, _written = _written, set()
    try:
        yield
    finally:
        _written = outer


def _nearest_existing(path: Path) -> Path:
    for above in (path, *path.parents):
        if os.path.lexists(above):
            return above
    return Path(path.anchor)


def _folder_problem(folder: Path) -> str | None:
    """Why ``folder`` (resolved) cannot hold new files, tried without making it; or None."""
    existing = _nearest_existing(folder)
    if not existing.is_dir():
        return (f"{existing} is a file, not a folder" if existing == folder
                else f"{existing} is a file, and it would be written under it")
    for above in (folder, *folder.parents):
        if (above / COLLECTED).is_file():
            return (f"{above} is a collected lease's folder (it holds {COLLECTED}), kept as "
                    "collected: what is derived from a lease is written beside its folder")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
        usage = os.statvfs(existing)
    except OSError as e:
        return f"{existing} cannot be written ({e.strerror or e})"
    if usage.f_bavail * usage.f_frsize < MIN_FREE_BYTES:
        return (f"{existing}'s disk has {usage.f_bavail * usage.f_frsize} bytes free, less than "
                f"the {MIN_FREE_BYTES >> 20} MiB its tables need")
    return None


def _inside(name: str) -> bool:
    """A file's name, or its path below the folder ('a100/tp2/x.csv'), never above it."""
    parts = Path(name).parts
    return bool(parts) and not Path(name).is_absolute() and not {".", ".."} & set(parts) \
        and "/".join(parts) == name


def _path_problem(path: Path) -> str | None:
    above = _nearest_existing(path.parent)
    if not above.is_dir():
        return f"{above} is a file, and it would be written under it"
    if _written is not None and path in _written:
        return (f"{path} was written by an earlier command of this call: each command needs its "
                "own file")
    if path.is_symlink():
        return f"{path} is a link: a writer replaces only a plain file"
    if os.path.lexists(path) and not path.is_file():
        return f"{path} is not a plain file (a folder, a FIFO or other)"
    return None


@dataclass
class Outputs:
    """``names``: each file's name in ``folder`` (or its path below it) and its provenance;
    ``given``: the option that set the folder (``--out=...``), as a refusal names it."""
    folder: Path
    names: Mapping[str, provenance.Provenance]
    given: str = ""
    force: bool = False
    how: str = "--force replaces them"
    staged: dict[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.folder = Path(self.folder).resolve()
        self.given = self.given or str(self.folder)
        if bad := next((n for n in self.names if not _inside(n)), None):
            raise OutputRefused(f"{self.given} is invalid: {bad!r} is no file name in it")

    @property
    def paths(self) -> dict[Path, provenance.Provenance]:
        return {self.folder / name: prov for name, prov in self.names.items()}

    def check(self) -> None:
        """Before any work: every refusal that can be told now."""
        check_writable(self.folder, self.names, self.given)
        try:
            provenance.check(self.paths, self.force, self.how)
        except provenance.ReplaceRefused as e:
            raise OutputRefused(str(e)) from None

    def add(self, name: str, data: bytes | str) -> None:
        if name not in self.names:
            raise KeyError(f"{name} is not among the planned outputs {sorted(self.names)}")
        self.staged[name] = data.encode() if isinstance(data, str) else bytes(data)

    def write(self) -> list[Path]:
        """What was added, with the folder's provenance.json, all at once; checked again first."""
        self.check()
        files = {self.folder / name: data for name, data in self.staged.items()}
        recorded = {name: self.names[name] for name in self.staged}
        if recorded:
            sidecar = self.folder / provenance.SIDECAR
            files[sidecar] = provenance.sidecar_text(self.folder, recorded).encode()
        write_or_refuse(files, self.given, self.folder)
        written = [self.folder / name for name in self.staged]
        if _written is not None:
            _written.update(written)
        return written


def check_writable(folder: Path, names: Iterable[str | Path], given: str) -> None:
    """Before any work: each of ``names`` (below ``folder``, links resolved) can be written: its
    folder made and written, its disk has room, no name is a folder or a link; or OutputRefused,
    naming ``given`` (the option that set the folder). Whether a file of another provenance may be
    replaced is provenance.check's, not this."""
    folder = Path(folder).resolve()
    paths = [folder / name for name in names]
    problem = next(filter(None, map(_folder_problem, dict.fromkeys(
        [folder, *(path.parent for path in paths)]))), None)
    problem = problem or next(filter(None, map(_path_problem, paths)), None)
    problem = problem or next((f"{path.parent} is reached through a link, out of {folder}"
                               for path in paths if path.parent.resolve() != path.parent), None)
    if problem is not None:
        raise OutputRefused(f"{given} is invalid: {problem}; nothing was written")


def write_or_refuse(files: Mapping[Path, bytes], given: str, folder: Path) -> None:
    """write_all, a failure (a disk filled meanwhile) an OutputRefused naming ``given``."""
    try:
        write_all(files)
    except OSError as e:
        raise OutputRefused(f"{given}: cannot write {e.filename or folder} ({e.strerror or e}); "
                            "nothing was written") from None


@contextmanager
def staged(folder: Path, given: str) -> Iterator[Path]:
    """A scratch copy of ``folder`` (links kept as links), for a command whose later steps read
    what its earlier ones wrote: every step writes into the copy, and what changed there is
    written into ``folder`` at once when the block ends (write_all); a failure writes nothing."""
    folder = Path(folder).resolve()
    with tempfile.TemporaryDirectory(prefix="sarathi-staged-") as scratch:
        stage = Path(scratch) / "stage"
        try:
            if folder.is_dir():
                shutil.copytree(folder, stage, symlinks=True)
            else:
                stage.mkdir()
        except OSError as e:
            raise OutputRefused(f"{given}: cannot stage {e.filename or folder} "
                                f"({e.strerror or e}); nothing was written") from None
        yield stage
        write_or_refuse(changed(stage, folder), given, folder)


def changed(stage: Path, folder: Path) -> dict[Path, bytes]:
    """The plain files under ``stage`` new to ``folder`` or other than its, by their path there."""
    found = {}
    for path in sorted(stage.rglob("*")):
        if path.is_file() and not path.is_symlink():
            data, target = path.read_bytes(), folder / path.relative_to(stage)
            if not (target.is_file() and target.read_bytes() == data):
                found[target] = data
    return found


def write_all(files: Mapping[Path, bytes]) -> None:
    """Every file or none: each written beside its name (never through a link), then all renamed
    over; folders made on the way are removed again on a failure."""
    made, staged = [], {}
    try:
        for path, data in files.items():
            for folder in reversed([path.parent, *path.parent.parents]):
                if not folder.exists():
                    folder.mkdir()
                    made.append(folder)
            staged[path] = tmp = path.with_name(f".{path.name}.writing-{os.getpid()}")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as e:
                e.filename = str(path)  # the file the user asked for, not its staging name
                raise
        for path, tmp in staged.items():
            os.replace(tmp, path)
    except BaseException:
        for tmp in staged.values():
            with suppress(OSError):
                tmp.unlink()
        for folder in reversed(made):
            with suppress(OSError):
                folder.rmdir()
        raise
