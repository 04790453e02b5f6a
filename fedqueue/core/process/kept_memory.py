"""Freed memory a worker process keeps for its next allocations, where glibc's malloc would hand it back.

glibc serves an allocation of 32 MiB or more (below that, of more than its adaptive threshold) with a mapping
of its own and unmaps it when freed, and gives back the free top of its heaps past 128 KiB. A task that
allocates a model's states, gradients and sums anew every round then has the kernel find and zero every page
of them again on first touch: with a 45 MB state on a 2-core VM, that took more than half of a device's
training and of an aggregation's step. A worker keeps up to `limit_mb` of freed memory at its heaps' tops
instead (no allocation gets a mapping of its own; past the limit the top is given back as before).
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

from fedqueue.config import FREED_MEMORY_MB_MAX

log = logging.getLogger(__name__)

# mallopt's parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# The user's own tuning of the allocator: theirs is kept.
_USER_TUNING = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES", "LD_PRELOAD")


def keep_freed_memory(limit_mb: int) -> bool:
    """Have this process's malloc keep up to `limit_mb` MiB of freed memory for reuse; whether it now does.

    Nothing is changed where `limit_mb` is 0, off Linux, without glibc, or where the environment tunes the
    allocator already (MALLOC_*_ variables, GLIBC_TUNABLES, a preloaded allocator)."""
    if limit_mb <= 0 or not sys.platform.startswith("linux"):
        return False
    tuned = [name for name in _USER_TUNING if os.environ.get(name)]
    if tuned:
        log.info("the allocator is tuned by %s: left as it is", ", ".join(tuned))
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc's own: mallopt's parameters differ elsewhere
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    limit_bytes = min(limit_mb, FREED_MEMORY_MB_MAX) << 20
    # Trim threshold first: with no mapping of their own, freed blocks go back to the heaps, kept up to it.
    return bool(mallopt(_M_TRIM_THRESHOLD, limit_bytes)) and bool(mallopt(_M_MMAP_MAX, 0))
