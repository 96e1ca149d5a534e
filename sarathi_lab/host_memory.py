"""How much memory this process has, for every sizing: a cgroup's ``memory.max`` or ``ulimit -v``
can bind far below the machine's free memory, and an allocation the arithmetic allowed would fail
halfway. Standard library only."""
from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

_CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Memory:
    """Bytes this process may still take, and what set that bound (as a refusal quotes it)."""
    bytes: int
    bound_by: str


def _read_int(path: Path) -> int | None:
    """None where absent, unreadable or unlimited ("max")."""
    try:
        text = path.read_text().split()
    except OSError:
        return None
    return int(text[0]) if text and text[0].isdigit() else None


def _proc_bytes(path: str, field: str) -> int | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_dirs() -> list[Path]:
    """Its own first, then each parent's (a parent's limit binds too); v2, else v1's memory."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "" or "memory" in controllers.split(","):
            base = _CGROUP_ROOT if controllers == "" else _CGROUP_ROOT / "memory"
            here = base / path.lstrip("/")
            return [here, *(p for p in here.parents if p.is_relative_to(base))]
    return []


def _cgroup_limits() -> list[tuple[Path, int]]:
    limits = [(d, _read_int(d / "memory.max") or _read_int(d / "memory.limit_in_bytes"))
              for d in _cgroup_dirs()]
    # v1's "no limit" is huge.
    return [(d, limit) for d, limit in limits if limit is not None and limit < 2**60]


def _cgroup_room() -> int | None:
    """The tightest cgroup limit less its usage; None: none set."""
    def used(d: Path) -> int:
        return _read_int(d / "memory.current") or _read_int(d / "memory.usage_in_bytes") or 0

    return min((max(limit - used(d), 0) for d, limit in _cgroup_limits()), default=None)


def _address_space() -> tuple[int, int] | None:
    """(RLIMIT_AS, the address space mapped already); None where no limit is set."""

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    return soft, _proc_bytes("/proc/self/status", "VmSize") or 0


def available() -> Memory:
    """The least of the machine's available memory, the cgroup's room and RLIMIT_AS's room."""
    machine = _proc_bytes("/proc/meminfo", "MemAvailable")
    if machine is None:
        machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    bounds = [Memory(machine, "the machine's available memory")]
    if (room := _cgroup_room()) is not None:
        bounds.append(Memory(room, "this process's cgroup memory limit (memory.max)"))
    if (space := _address_space()) is not None:
        limit, mapped = space
        bounds.append(Memory(max(limit - mapped, 0),
                             "this process's address-space limit (RLIMIT_AS, ulimit -v: "
                             f"{limit / 2**30:.1f} GiB, {mapped / 2**30:.1f} GiB mapped)"))
    return min(bounds, key=lambda m: m.bytes)


def total() -> int:
    """The most a process here could hold (the simulated CPU's size): the machine's, capped."""
    sizes = [os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
             *(limit for _, limit in _cgroup_limits())]

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        sizes.append(soft)
    return min(sizes)


def beyond(need_bytes: int) -> str | None:
    """Why ``need_bytes`` cannot be held here, for a refusal ('more than the ... available'), or
    None where it fits."""
    have = available()
    if need_bytes <= have.bytes:
        return None
    return (f"about {need_bytes / 2**30:,.1f} GiB, more than the {have.bytes / 2**30:,.1f} GiB "
            f"available ({have.bound_by})")
