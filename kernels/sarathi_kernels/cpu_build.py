"""The CPU kernels (csrc/*.cpp: paged-decode attention, fused elementwise ops), built once per machine.

The sources are plain C functions over raw pointers: the system C++ compiler builds them into one
shared library in a couple of seconds (no torch headers, no ninja) and ctypes loads it. Builds are
content-addressed, named by a hash of the sources, the compiler command and version, and the CPU's
ISA flags (``-march=native`` code built on an AVX-512 machine must never load on an AVX2-only one),
so two environments or two machines sharing a home directory never evict or rebuild each other's
builds. A build is written beside its final name and renamed into place: concurrent processes and a
kill mid-build never leave a broken file behind. Without a compiler (or if the build fails) one line
says so and callers fall back to torch's ops.

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
import subprocess
import sys
import tempfile
from pathlib import Path

_CSRC = Path(__file__).parent / "csrc"
SOURCES = sorted(_CSRC.glob("*.cpp"))
# -ffast-math: vector exp from glibc's libmvec and vector-order sums (each source says where it
# relies on it, and where it keeps infinities out). It is given to the compile step only: linking
# with it adds crtfastmath.o, whose constructor sets flush-to-zero and denormals-are-zero for the
# whole process the moment the library loads, silently changing every other float op in Python.
# -mprefer-vector-width=512: GCC auto-vectorises the elementwise loops 256 bits wide on AVX-512
# targets unless told otherwise; 512 measured 1.2-1.4x on bfloat16 SiLU x up, RoPE and RMSNorm alone
# and 1.035x on a bfloat16 prefill-256 iteration (Xeon with AMX, session 13); float32 iterations
# even. Targets without AVX-512 ignore it; the explicit vector kernels are as wide either way.
_COMPILE = ["-O3", "-mprefer-vector-width=512", "-ffast-math", "-fopenmp", "-fPIC", "-std=c++17", "-c"]
# GCC's tuning for AMD Zen 1-3 (-march=native there) splits a multiply-add whose sum feeds the next
# one into a multiply and an add, in some loops and not others: the few-row linear's sums then
# rounded differently by the batch's row count, so a decode token's logits depended on which
# requests shared its iteration (found on a real EPYC Zen 3, where tests/test_cpu_small_linear.py
# failed). Every multiply-add is fused, on every CPU, as the kernels' equal-bits guarantees assume.
_GCC_COMPILE = ["--param=avoid-fma-max-bits=0"]
_LINK = ["-shared", "-fopenmp"]


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


def compile_flags(march: str | None = None, mtune: str | None = None, cxx: str | None = None) -> list[str]:
    """The flags each source is compiled with by ``cxx`` (default: ``compiler()``), for ``march``
    and ``mtune`` (defaults: SARATHI_KERNELS_MARCH, else native; SARATHI_KERNELS_MTUNE, else none)."""
    march = march or os.environ.get("SARATHI_KERNELS_MARCH") or "native"
    mtune = mtune or os.environ.get("SARATHI_KERNELS_MTUNE")
    gcc = "clang" not in _version(cxx or compiler())
    return [f"-march={march}", *([f"-mtune={mtune}"] if mtune else []), *_COMPILE, *(_GCC_COMPILE if gcc else [])]


def _build_key(cxx: str) -> str:
    version = _version(cxx)
    h = hashlib.sha256()
    for part in (*(s.read_bytes() for s in sorted(_CSRC.iterdir())), " ".join(compile_flags(cxx=cxx) + _LINK).encode(), version.encode(),
                 platform.machine().encode(), _cpu_flags().encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:20]


def _build(cxx: str) -> Path:
    """The shared library for these sources, compiler and CPU: from the cache, or built into it."""
    target = cache_dir() / f"cpu_kernels-{_build_key(cxx)}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"sarathi_lab: building the CPU kernels for this machine, once: {target}", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
        built = Path(tmp) / target.name
        objects = [Path(tmp) / f"{src.stem}.o" for src in SOURCES]
        for src, obj in zip(SOURCES, objects):
            _run([cxx, *compile_flags(cxx=cxx), str(src), "-o", str(obj)])
        _run([cxx, *_LINK, *map(str, objects), "-o", str(built)])
        os.replace(built, target)
    return target


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or [""])[0]
        raise RuntimeError(f"{cmd[0]} exited {done.returncode}: {first}")


@functools.cache
def library() -> ctypes.PyDLL | None:
    """The loaded library, or None (said once, in one line) where it cannot be built."""
    cxx = compiler()
    try:
        if shutil.which(cxx) is None:
            raise RuntimeError(f"no C++ compiler ({cxx!r} is not on PATH)")
        # PyDLL keeps the GIL, as a torch op would: releasing and retaking it around every call
        # measured slower on a loaded 2-core machine, and nothing else in the engine runs meanwhile.
        return ctypes.PyDLL(str(_build(cxx)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        print(f"sarathi_lab: the CPU kernels are unavailable ({e}); decode attention and the fused "
              "elementwise ops fall back to torch's", file=sys.stderr)
        return None


def function(name: str, argtypes: list, restype=None):
    """``name`` from the library with its C signature, or None where the library is unavailable."""
    lib = library()
    if lib is None:
        return None
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = argtypes, restype
    return fn
