"""Hand freed heap memory back to the system, so a long-running service's RSS follows
its state rather than its past peaks.

Batches come and go in buffers of many sizes. glibc's allocator (Python objects, the
Kafka clients' buffers, decompression) keeps freed pages in its arenas, and Arrow's
memory pool keeps freed blocks for reuse; neither shrinks by itself when the holes
are scattered. ``release_free_memory`` asks both to give back what is free. It is
safe at any time and costs milliseconds; the warehouse calls it after its commits (at
most every 10 s, and after each compaction), the Kafka service after each checkpoint.

Trimming cannot hand back a page that still holds one live block, and glibc makes such
pages likely by default in a long-running service: its mmap threshold rises with the
largest block freed (up to 32 MiB), so after the first large batch buffers of every size
are carved from the heap between long-lived objects; and each thread that allocates
gets an arena of its own (up to 8 per core). ``tune_allocator`` fixes the threshold
(large blocks are mapped and unmapped whole) and caps the arenas; the Kafka service
calls it once at start. glibc's own variables (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_ARENA_MAX``) win where they are set; ``GPULEDGER_MALLOC_TUNING=off`` leaves
glibc's defaults alone.
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


M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
"""``mallopt`` parameters (glibc's malloc.h)."""

MMAP_THRESHOLD = 256 << 10
"""Blocks this large or larger are mapped on their own and unmapped when freed."""
ARENA_MAX = 2


@cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


@cache
def tune_allocator() -> dict[str, int]:
    """Fix glibc's mmap threshold and cap its arenas (see the module's docstring), once
    per process; what was set (empty on other C libraries, or where glibc's environment
    variables set both)."""
    if os.environ.get("GPULEDGER_MALLOC_TUNING", "on").lower() in ("off", "0", "no", "false"):
        return {}
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return {}
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done: dict[str, int] = {}
    for env, param, value in (("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                              ("MALLOC_ARENA_MAX", M_ARENA_MAX, ARENA_MAX)):
        if env in os.environ:
            continue
        if mallopt(param, value) == 1:
            done[env] = value
        else:
            log.debug("mallopt(%d, %d) refused", param, value)
    return done


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``; None on other C libraries (musl, macOS)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    function: Callable[[int], int] = trim
    return function


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
