"""The CPU kernels (csrc/*.cpp: paged-decode attention, fused elementwise ops) and the host planner
(csrc/plan/), each a library built once per machine.

The sources are plain C functions over raw pointers: the system C++ compiler builds them into one
shared library (no torch headers, no ninja; a source a CPU at once) and ctypes loads it. Builds are
content-addressed, named by a hash of the sources, the compiler command and version, and the CPU's
ISA flags (``-march=native`` code built on an AVX-512 machine must never load on an AVX2-only one),
so two environments or two machines sharing a home directory never evict or rebuild each other's
builds. A build is written beside its final name and renamed into place: concurrent processes and a
kill mid-build never leave a broken file behind. Without a compiler (or if the build fails) one line
says so and callers fall back to torch's ops.

Loading a shared library runs its code, so the cache only ever loads what this user built: the
directory is private (0700, owned by this user; one that is not, and cannot be made so, is refused
in one line), each build's SHA-256 is recorded beside it, and a cached file is loaded only through
the descriptor that was checked (a regular file owned by this user, writable by no one else, whose
bytes hash to the record). A file that fails (truncated by a full disk, planted at the hashed name,
left by a build that died before its record) is rebuilt, said in one line: dlopen'ing a truncated
file killed the process with SIGBUS, and a planted one ran its author's code.

``SARATHI_KERNELS_MARCH`` (default ``native``) builds for another ``-march`` target, to run the
kernels' tests on the code another machine kind would get: on an AVX-512 machine, ``x86-64-v3``
builds the AVX2-only code, ``cascadelake`` the AVX-512 code without bfloat16 instructions.
``SARATHI_KERNELS_MTUNE`` adds an ``-mtune`` (``native`` tunes for this CPU already): ``znver3``
with ``x86-64-v3`` is what an AMD EPYC Zen 3 builds natively.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

_CSRC = Path(__file__).parent / "csrc"
# -ffast-math: vector exp from glibc's libmvec and vector-order sums (each source says where it
# relies on it, and where it keeps infinities out). It is given to the compile step only: linking
# with it adds crtfastmath.o, whose constructor sets flush-to-zero and denormals-are-zero for the
# whole process the moment the library loads, silently changing every other float op in Python.
# -mprefer-vector-width=512: GCC auto-vectorises the elementwise loops 256 bits wide on AVX-512
# targets unless told otherwise; 512 measured faster on the bfloat16 elementwise kernels (SiLU x up,
# RoPE, RMSNorm) and no slower in float32 (benchmarks/RESULTS.md). Targets without AVX-512 ignore it;
# the explicit vector kernels are as wide either way.
_COMPILE = ("-O3", "-mprefer-vector-width=512", "-ffast-math", "-fopenmp", "-fPIC", "-std=c++17", "-c")
# GCC's tuning for AMD Zen 1-3 (-march=native there) splits a multiply-add whose sum feeds the next
# one into a multiply and an add, in some loops and not others: the few-row linear's sums then
# rounded differently by the batch's row count, so a decode token's logits depended on which
# requests shared its iteration (found on a real EPYC Zen 3, where tests/test_cpu_small_linear.py
# failed). Every multiply-add is fused, on every CPU, as the kernels' equal-bits guarantees assume.
_GCC_COMPILE = ["--param=avoid-fma-max-bits=0"]
_LINK = ["-shared", "-fopenmp"]


@dataclass(frozen=True)
class Library:
    """One shared library, ``name`` on disk and ``what`` in messages: the ``.cpp`` files of ``folder``
    (its other files, headers, are part of its build key), compiled with ``compile``; ``fallback``
    says what runs where it cannot be built."""

    name: str
    what: str
    folder: Path
    compile: tuple[str, ...]
    fallback: str

    @property
    def sources(self) -> list[Path]:
        return sorted(self.folder.glob("*.cpp"))

    def files(self) -> list[Path]:
        return sorted(p for p in self.folder.iterdir() if p.is_file())


KERNELS = Library("cpu_kernels", "the CPU kernels", _CSRC, _COMPILE,
                  "decode attention and the fused elementwise ops fall back to torch's")
# The host planner must make the numpy planner's very plan: no fast-math reassociation and no
# fused multiply-adds, so that every float sum rounds as numpy's does.
PLANNER = Library("host_plan", "the planning functions", _CSRC / "plan",
                  ("-O3", "-ffp-contract=off", "-fPIC", "-std=c++17", "-c"),
                  "balanced attention work is planned in numpy")


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sarathi_lab" / "kernels"


def cpuinfo(field: str) -> str:
    """The first CPU's ``field`` in /proc/cpuinfo ("flags", "vendor_id", ...); "" where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith(field)), "")
    except OSError:
        line = ""
    return line.partition(":")[2].strip()


def _cpu_flags() -> str:
    return " ".join(sorted(cpuinfo("flags").split())) or platform.processor()


def compiler() -> str:
    return os.environ.get("CXX") or "c++"


@functools.cache
def _version(cxx: str) -> str:
    return subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout


def compile_flags(march: str | None = None, mtune: str | None = None, cxx: str | None = None,
                  lib: Library = KERNELS) -> list[str]:
    """The flags each source of ``lib`` is compiled with by ``cxx`` (default: ``compiler()``), for
    ``march`` and ``mtune`` (defaults: SARATHI_KERNELS_MARCH, else native; SARATHI_KERNELS_MTUNE,
    else none)."""
    march = march or os.environ.get("SARATHI_KERNELS_MARCH") or "native"
    mtune = mtune or os.environ.get("SARATHI_KERNELS_MTUNE")
    gcc = "clang" not in _version(cxx or compiler())
    return [f"-march={march}", *([f"-mtune={mtune}"] if mtune else []), *lib.compile,
            *(_GCC_COMPILE if gcc else [])]


def _build_key(cxx: str, lib: Library = KERNELS) -> str:
    version = _version(cxx)
    h = hashlib.sha256()
    for part in (*(s.read_bytes() for s in lib.files()), " ".join(compile_flags(cxx=cxx, lib=lib) + _LINK).encode(),
                 version.encode(), platform.machine().encode(), _cpu_flags().encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:20]


def _private_dir(path: Path) -> Path:
    """``path``, created 0700 where missing; a RuntimeError naming it where another user owns it (or
    it is not a directory): who can write there can choose the code this process loads."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.lstat()
    except OSError as e:
        raise RuntimeError(f"cannot create the kernel cache {path}: {e.strerror or e}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise RuntimeError(f"the kernel cache {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise RuntimeError(f"the kernel cache {path} belongs to uid {st.st_uid}, not this user ({os.geteuid()}): "
                           "not loading code from it (set XDG_CACHE_HOME to a directory of your own)")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def _sha256(fd: int) -> str:
    h = hashlib.sha256()
    with os.fdopen(os.dup(fd), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _own_file(fd: int) -> bool:
    st = os.fstat(fd)
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _open_verified(target: Path) -> tuple[int | None, str]:
    """A descriptor of ``target`` whose bytes hash to its recorded SHA-256 and that only this user can
    write, or None and why not ("" where it is simply not built yet)."""
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None, ""
    except OSError as e:
        return None, f"cannot be opened ({e.strerror or e})"
    try:
        if not _own_file(fd):
            raise _Unverified("is not a regular file of this user's, writable by this user only")
        try:
            record = os.open(_record(target), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            raise _Unverified("has no recorded hash (a build that did not finish, or not this cache's)") from None
        try:
            want = os.read(record, 128).decode("ascii", "replace").strip() if _own_file(record) else ""
        finally:
            os.close(record)
        if _sha256(fd) != want:
            raise _Unverified("does not hash to its record (truncated, or replaced)")
    except _Unverified as e:
        os.close(fd)
        return None, str(e)
    return fd, ""


class _Unverified(Exception):
    pass


def _record(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _build(cxx: str, lib: Library) -> int:
    """A descriptor of ``lib`` for its sources, this compiler and CPU, verified: from the cache, or
    built into it."""
    target = _private_dir(cache_dir()) / f"{lib.name}-{_build_key(cxx, lib)}.so"
    fd, why = _open_verified(target)
    if fd is not None:
        return fd
    if why:
        print(f"sarathi_lab: the cached {lib.what} {target} {why}: building them again", file=sys.stderr)
    else:
        print(f"sarathi_lab: building {lib.what} for this machine, once: {target}", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
        built = Path(tmp) / target.name
        objects = [Path(tmp) / f"{src.stem}.o" for src in lib.sources]
        # One compiler a CPU this process may run on, the largest sources first: the build takes about
        # as long as its longest source rather than the sum of all.
        flags = compile_flags(cxx=cxx, lib=lib)
        jobs = sorted(zip(lib.sources, objects), key=lambda job: -job[0].stat().st_size)
        with ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0))) as pool:
            list(pool.map(lambda job: _run([cxx, *flags, str(job[0]), "-o", str(job[1])]), jobs))
        _run([cxx, *_LINK, *map(str, objects), "-o", str(built)])
        os.chmod(built, 0o600)  # whatever the umask: the mode is checked at every load
        fd = os.open(built, os.O_RDONLY | os.O_NOFOLLOW)
        record = Path(tmp) / _record(target).name
        record.write_text(_sha256(fd) + "\n")
        os.chmod(record, 0o600)
        # The library first, its record second: a kill between them leaves a library without a
        # record, which is rebuilt, never a record that vouches for an older file.
        os.replace(built, target)
        os.replace(record, _record(target))
    return fd


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or [""])[0]
        raise RuntimeError(f"{cmd[0]} exited {done.returncode}: {first}")


@functools.cache
def library(lib: Library = KERNELS) -> ctypes.PyDLL | None:
    """``lib`` loaded, or None (said once, in one line) where it cannot be built."""
    cxx = compiler()
    try:
        if shutil.which(cxx) is None:
            raise RuntimeError(f"no C++ compiler ({cxx!r} is not on PATH)")
        fd = _build(cxx, lib)
        try:
            # Through the checked descriptor, not the name: the file the name points at could be
            # swapped between the check and the load.
            # PyDLL keeps the GIL, as a torch op would: releasing and retaking it around every call
            # measured slower on a loaded 2-core machine, and nothing else in the engine runs meanwhile.
            loaded = ctypes.PyDLL(f"/proc/self/fd/{fd}")
        except OSError:
            os.close(fd)
            raise
        # The descriptor stays open: the dynamic loader knows a library by the path it was opened
        # by, and a second library opened through a reused descriptor number would be handed the first.
        return loaded
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        print(f"sarathi_lab: {lib.what} are unavailable ({e}); {lib.fallback}", file=sys.stderr)
        return None


def function(name: str, argtypes: list, restype=None, lib: Library = KERNELS):
    """``name`` from ``lib`` with its C signature, or None where it is unavailable."""
    loaded = library(lib)
    if loaded is None:
        return None
    fn = getattr(loaded, name)
    fn.argtypes, fn.restype = argtypes, restype
    return fn
