"""The CPU paged-decode attention kernel (csrc/paged_decode_cpu.cpp), built once per machine.

The source is a plain C function over raw pointers: the system C++ compiler builds it in about a
second (no torch headers, no ninja) and ctypes loads it. Builds are content-addressed, named by a
hash of the source, the compiler command and version, and the CPU's ISA flags (``-march=native``
code built on an AVX-512 machine must never load on an AVX2-only one), so two environments or two
machines sharing a home directory never evict or rebuild each other's builds. A build is written
beside its final name and renamed into place: concurrent processes and a kill mid-build never leave
a broken file behind. Without a compiler (or if the build fails) one line says so and callers fall
back to torch's attention.
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

import torch

_SOURCE = Path(__file__).parent / "csrc" / "paged_decode_cpu.cpp"
_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
_PTR, _I64 = ctypes.c_void_p, ctypes.c_int64


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sarathi_lab" / "kernels"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        flags = ""
    return " ".join(sorted(flags.partition(":")[2].split())) or platform.processor()


def _build_key(compiler: str) -> str:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    h = hashlib.sha256()
    for part in (_SOURCE.read_bytes(), " ".join(_FLAGS).encode(), version.encode(), platform.machine().encode(),
                 _cpu_flags().encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:20]


def _build(compiler: str) -> Path:
    """The shared library for this source, compiler and CPU: from the cache, or built into it."""
    target = cache_dir() / f"paged_decode_cpu-{_build_key(compiler)}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"sarathi_lab: building the CPU paged-decode kernel for this machine, once: {target}", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
        built = Path(tmp) / target.name
        done = subprocess.run([compiler, *_FLAGS, str(_SOURCE), "-o", str(built)], capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or [""])[0]
            raise RuntimeError(f"{compiler} exited {done.returncode}: {first}")
        os.replace(built, target)
    return target


@functools.cache
def _library():
    compiler = os.environ.get("CXX") or "c++"
    try:
        if shutil.which(compiler) is None:
            raise RuntimeError(f"no C++ compiler ({compiler!r} is not on PATH)")
        # PyDLL keeps the GIL, as a torch op would: releasing and retaking it around every call
        # measured slower on a loaded 2-core machine, and nothing else in the engine runs meanwhile.
        lib = ctypes.PyDLL(str(_build(compiler)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        print(f"sarathi_lab: the CPU paged-decode kernel is unavailable ({e}); decode attention falls back to "
              "torch's scaled_dot_product_attention", file=sys.stderr)
        return None
    fn = lib.paged_decode
    fn.argtypes = [_PTR] * 6 + [_I64] * 6 + [ctypes.c_float, ctypes.c_int]
    fn.restype = None
    return fn


def available() -> bool:
    return _library() is not None


def paged_decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """[n, heads, d] float32 queries, one per request, against their ``seq_lens`` cached tokens.

    k_cache/v_cache [blocks, block_size, kv_heads, d] float32 contiguous; block_tables int32 [n, max_blocks];
    seq_lens int32 [n]. Values (lengths, block ids) are trusted, as the engine built them.
    """
    query, tables, lens = query.contiguous(), block_tables.contiguous(), seq_lens.contiguous()
    n, heads, d = query.shape
    _, block_size, kv_heads, cache_d = k_cache.shape
    # Checked because a wrong layout would read out of bounds, not raise; kept to cheap attribute
    # reads, as this runs in every layer.
    if not (query.dtype == k_cache.dtype == v_cache.dtype == torch.float32 and query.is_cpu and k_cache.is_cpu
            and v_cache.is_cpu and k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("paged_decode: float32 CPU tensors with contiguous caches only")
    if not (v_cache.shape == k_cache.shape and cache_d == d and heads % kv_heads == 0 and len(tables) == n
            and lens.shape == (n,) and tables.dtype == lens.dtype == torch.int32 and tables.is_cpu and lens.is_cpu):
        raise ValueError(f"paged_decode: query {tuple(query.shape)}, caches {tuple(k_cache.shape)}, int32 tables "
                         f"{tuple(tables.shape)} and lens {tuple(lens.shape)} do not fit")
    out = torch.empty_like(query)
    _library()(query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), lens.data_ptr(),
               out.data_ptr(), n, heads, d, block_size, kv_heads, tables.shape[1], scale, torch.get_num_threads())
    return out
