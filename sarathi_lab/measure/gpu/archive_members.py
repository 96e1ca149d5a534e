"""A GPU suite's archive read untrusted: members only once the whole was checked."""
from __future__ import annotations

import gzip
import os
import stat
import tarfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sarathi_lab.analysis import gpu_records
from sarathi_lab.analysis.gpu_records import MAX_FILE_BYTES, NAME_PART, SUMMARY, Summary

# the archive on disk (a call brings back at most MAX_FILE_BYTES of it)
MAX_ARCHIVE_BYTES = 64 << 20
MAX_TOTAL_BYTES = 256 << 20
MAX_TAIL_BYTES = 1 << 20
MAX_MEMBERS = 50_000
MAX_DEPTH = 16
KINDS = {tarfile.SYMTYPE: "a symbolic link", tarfile.LNKTYPE: "a hard link",
         tarfile.FIFOTYPE: "a FIFO", tarfile.CHRTYPE: "a character device",
         tarfile.BLKTYPE: "a block device"}
DAMAGED = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, OSError)


class ArchiveRefused(ValueError):
    """Not an archive the suite could have written; the message is one line."""


def _shown(text: str, limit: int = 80) -> str:
    flat = " ".join(str(text).split())
    return repr(flat if len(flat) <= limit else flat[:limit] + "...")


def check_name(name: str, what: str) -> str:
    """``name`` if every part is on the allow-list, else an ArchiveRefused naming ``what``."""
    if not isinstance(name, str):
        raise ArchiveRefused(f"{what} is {_shown(name)}, not a name")
    parts = name.split("/")
    if len(parts) > MAX_DEPTH:
        raise ArchiveRefused(f"{what} {_shown(name)} is {len(parts)} "
                             f"folders deep, more than {MAX_DEPTH}")
    for part in parts:
        if part in (".", "..") or not NAME_PART.fullmatch(part):
            raise ArchiveRefused(f"{what} {_shown(name)} is not a safe name: each part must be 1 "
                                 "to 128 of A-Z a-z 0-9 _ . = , + - and not '.' or '..'")
    return name


def inside(root: Path, relative: str | Path, what: str) -> Path:
    """``root / relative`` resolved (links followed); ArchiveRefused where it leaves ``root``."""
    base = Path(root).resolve()
    target = (base / relative).resolve()
    if not target.is_relative_to(base):
        raise ArchiveRefused(f"{what} would be written at {target}, outside {base}")
    return target


def _member_name(member: tarfile.TarInfo) -> str | None:
    """The name as the suite writes it (no './' or trailing '/'); None for the root folder."""
    name = (member.name.removeprefix("./").rstrip("/") if member.isdir()
            else member.name.removeprefix("./"))
    return None if name in ("", ".") and member.isdir() else name


def _checked(tar: tarfile.TarFile) -> dict[str, tarfile.TarInfo]:
    """Every member by name, read through to the end and checked."""
    found: dict[str, tarfile.TarInfo] = {}
    total = 0
    for member in tar:
        if len(found) >= MAX_MEMBERS:
            raise ArchiveRefused(f"it holds more than {MAX_MEMBERS} members")
        regular = member.type in (tarfile.REGTYPE, tarfile.AREGTYPE)
        if not regular and not member.isdir():
            kind = KINDS.get(member.type, f"of tar type {member.type!r}")
            raise ArchiveRefused(f"member {_shown(member.name)} is {kind}: only regular "
                                 "files and folders are read")
        name = _member_name(member)
        if name is None:
            continue
        check_name(name, "member")
        if name in found:
            raise ArchiveRefused(f"member {_shown(name)} occurs twice")
        if regular:
            if member.size > MAX_FILE_BYTES:
                raise ArchiveRefused(f"member {_shown(name)} is {member.size} bytes, more than the "
                                     f"{MAX_FILE_BYTES >> 20} MiB any file of the suite is")
            total += member.size
            if total > MAX_TOTAL_BYTES:
                raise ArchiveRefused(f"its members expand to more than {MAX_TOTAL_BYTES >> 20} MiB")
        found[name] = member
    # Read to the end of the gzip stream too: one cut short or with a wrong checksum is damaged.
    tail = 0
    while chunk := tar.fileobj.read(1 << 20):
        tail += len(chunk)
        if tail > MAX_TAIL_BYTES:
            raise ArchiveRefused(f"more than {MAX_TAIL_BYTES >> 20} MiB follow the end of its tar")
    folders = {"/".join(name.split("/")[:i]) for name in found
               for i in range(1, name.count("/") + 1)}
    if clash := sorted(n for n in folders if n in found and not found[n].isdir()):
        raise ArchiveRefused(f"member {_shown(clash[0])} is both a "
                             "file and the folder of other members")
    return found


def _open_regular(path: Path, label: str):
    """``path`` opened without waiting (FIFOs block), checked a regular file within the limit."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ArchiveRefused(f"{label} is invalid: not a readable tar archive (it cannot be "
                             f"opened: {e.strerror or e})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_ARCHIVE_BYTES:
        os.close(fd)
        what = "it is not a regular file" if not stat.S_ISREG(info.st_mode) else (
            f"{info.st_size} bytes, more than the "
            f"{MAX_ARCHIVE_BYTES >> 20} MiB a suite's archive is at most")
        raise ArchiveRefused(f"{label} is invalid: not a readable tar archive ({what})")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


@contextmanager
def open_archive(path: Path,
                 label: str) -> Iterator[tuple[tarfile.TarFile, dict[str, tarfile.TarInfo]]]:
    """The archive and its checked members by name; ``label`` names it in a refusal."""
    with _open_regular(path, label) as raw:
        try:
            tar = tarfile.open(fileobj=raw, mode="r:*")  # noqa: SIM115 (entered just below)
        except DAMAGED as e:
            raise ArchiveRefused(f"{label} is invalid: not a readable tar archive "
                                 f"({_reason(e)})") from None
        with tar:
            try:
                members = _checked(tar)
            except ArchiveRefused as e:
                raise ArchiveRefused(f"{label} is invalid: {e}") from None
            except (*DAMAGED, RecursionError) as e:
                raise ArchiveRefused(f"{label} is invalid: not a readable tar archive "
                                     f"({_reason(e)})") from None
            yield tar, members


def read_member(tar: tarfile.TarFile, member: tarfile.TarInfo, label: str) -> bytes:
    """A member's bytes, or an ArchiveRefused where the archive is damaged there."""
    try:
        with tar.extractfile(member) as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except DAMAGED as e:
        raise ArchiveRefused(f"{label} is invalid: member {_shown(member.name)} is unreadable "
                             f"({_reason(e)})") from None
    if len(data) != member.size:
        raise ArchiveRefused(f"{label} is invalid: member {_shown(member.name)} holds {len(data)} "
                             f"bytes, not the {member.size} its header says")
    return data


def file_bytes(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], name: str,
               label: str) -> bytes | None:
    """A file member's bytes by name; None where there is none (or a folder)."""
    if name not in members or members[name].isdir():
        return None
    return read_member(tar, members[name], label)


def read_summary(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo],
                 label: str) -> Summary | None:
    """The suite's summary.json checked against its schema; None where the archive has none."""
    data = file_bytes(tar, members, SUMMARY, label)
    where = f"{label}'s {SUMMARY}"
    return None if data is None else gpu_records.summary(gpu_records.parse_json(data, where), where)


def _reason(e: BaseException) -> str:
    return " ".join((str(e) or type(e).__name__).split())[:200]
