"""glibc malloc settings for processes that decode many chunks.

Every decode allocates and frees buffers of about a chunk (1 MiB): by default glibc serves those
with fresh mmaps and unmaps them on free, so every chunk pays page faults and zeroing of new
pages, a large part of the decode time. Keeping such buffers in the
heap (mmap threshold 32 MiB, the most glibc allows) and letting up to 256 MiB of free heap stay
mapped removes that; the heap still never grows past the process's peak use, which the cache
budget bounds. No effect (and no error) on other C libraries, or when the user set MALLOC_*_.
"""
from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 256 << 20


def tune_malloc() -> bool:
    """Apply the settings above; True if glibc took them."""
    if any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    try:
        # the symbols the process already has (the C library among them): no library search,
        # which (ctypes.util) cost every command a few hundredths of a second to start
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
