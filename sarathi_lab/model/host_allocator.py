"""Keeps freed host memory mapped: glibc's returns made layers page-fault (docs/cpu_engine.md)."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

# mallopt's parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
# Free memory at the heap's top glibc keeps mapped: the largest value.
_KEEP_BYTES = 2**31 - 1


@functools.cache
def reuse_freed_memory() -> bool:
    if "GLIBC_TUNABLES" in os.environ or any(k.startswith("MALLOC_") and k.endswith("_")
                                             for k in os.environ):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
    except OSError:
        return False
    # glibc's mallopt only (musl's has other parameters).
    if not hasattr(libc, "gnu_get_libc_version"):
        return False
    return libc.mallopt(_M_MMAP_MAX, 0) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES) == 1
