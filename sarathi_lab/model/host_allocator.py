"""Keeps the host's freed memory for reuse instead of handing it back to the kernel after each tensor.

Why: glibc serves every allocation above 32 MB (and smaller ones until its adaptive threshold has
grown) with a fresh ``mmap`` and unmaps it on free, so each large activation of a CPU forward pass
(a whole-prompt prefill of cpu-small at 4,940 tokens allocates ~240 MB per layer) is page-faulted
and zeroed by the kernel again in every layer of every iteration: 237,000 minor faults (0.93 GB)
per run of the benchmarks' mixed workload, measured; a fresh 81 MB tensor costs 19 ms to fill where
a reused one costs 2.6. Turning off glibc's mmap path and its heap trimming keeps freed pages mapped
(the process holds at most its own peak, as any caching allocator does; torch's CPU allocator does
not cache). vLLM's CPU backend asks for tcmalloc through LD_PRELOAD for the same reason; this needs
nothing at start-up.

It acts only on glibc's malloc, and not where the user has tuned it already (any ``MALLOC_*_``
variable or ``GLIBC_TUNABLES`` in the environment): those settings win, and setting one, e.g.
``MALLOC_MMAP_MAX_=65536``, is the opt-out.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

# mallopt's parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
# Free memory at the heap's top that glibc keeps mapped instead of trimming: its largest value.
_KEEP_BYTES = 2**31 - 1


def user_tuned() -> bool:
    return "GLIBC_TUNABLES" in os.environ or any(k.startswith("MALLOC_") and k.endswith("_") for k in os.environ)


@functools.cache
def reuse_freed_memory() -> bool:
    """Once per process: glibc keeps freed memory for reuse. Whether it now does."""
    if user_tuned():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # glibc's mallopt only (musl's has other parameters)
        return False
    return libc.mallopt(_M_MMAP_MAX, 0) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES) == 1
