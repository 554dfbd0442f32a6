"""Hand freed heap memory back to the system, so a long-running service's RSS follows
its state rather than its past peaks.

Batches come and go in buffers of many sizes. glibc's allocator (Python objects, the
Kafka clients' buffers, decompression) keeps freed pages in its arenas, and Arrow's
memory pool keeps freed blocks for reuse; neither shrinks by itself when the holes
are scattered. ``release_free_memory`` asks both to give back what is free. It is
safe at any time and costs milliseconds; the warehouse calls it after its commits (at
most every 10 s, and after each compaction), the Kafka service after each checkpoint.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import time
from collections.abc import Callable
from functools import cache

log = logging.getLogger(__name__)


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``; None on other C libraries (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def rss_bytes() -> int | None:
    """This process's resident set size (Linux), or None where /proc is absent."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def release_free_memory() -> int:
    """Give free heap pages back to the system; the bytes the RSS fell by (0 if unknown)."""
    before = rss_bytes()
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except Exception as exc:  # an old PyArrow without it: nothing to release there
        log.debug("Arrow memory pool not released: %s", exc)
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    after = rss_bytes()
    if before is None or after is None:
        return 0
    return max(before - after, 0)


class PeriodicRelease:
    """``release_free_memory`` at most once per ``interval_s`` (or when forced): for
    loops whose steps are faster than a release is worth (milliseconds each)."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self.released = 0
        """Bytes handed back so far."""
        self._last = time.monotonic()

    def __call__(self, force: bool = False) -> int:
        if not force and time.monotonic() - self._last < self.interval_s:
            return 0
        freed = release_free_memory()
        self._last = time.monotonic()
        self.released += freed
        return freed
