"""Free heap pages go back to the system after a checkpoint (``memory.py``)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from gpuledger.pipeline.memory import release_free_memory, rss_bytes


def test_freed_heap_below_a_live_block_is_handed_back() -> None:
    """glibc returns freed heap to the system only from its top; a block still alive
    above 200 MB of freed ones held them all until ``malloc_trim``."""
    blocks = [bytearray(100_000) for _ in range(2_000)]  # below the mmap threshold
    keep = blocks[-1]  # the newest block, at the heap's top
    del blocks[:]
    before = rss_bytes()
    assert before is not None
    released = release_free_memory()
    after = rss_bytes()
    assert after is not None
    assert released >= 100 * 2**20, released
    assert before - after >= 100 * 2**20
    assert keep == bytearray(100_000)


def test_nothing_to_release_is_no_error() -> None:
    release_free_memory()
    assert release_free_memory() >= 0


ALLOCATOR_PROBE = """
import ctypes, json, sys
from gpuledger.pipeline.memory import tune_allocator

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
tuned = tune_allocator() if sys.argv[1] == "tuned" else {}
libc.free(libc.malloc(20 << 20))  # a large batch buffer, freed
before = libc.mallinfo2().hblks
block = libc.malloc(1 << 20)      # the next 1 MiB buffer: mapped on its own?
mapped = libc.mallinfo2().hblks - before
libc.free(block)
print(json.dumps({"tuned": tuned, "mapped": mapped}))
"""


def _probe(mode: str, **env: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", ALLOCATOR_PROBE, mode], check=True,
                         capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items()
                              if not k.startswith("MALLOC_")} | env)
    result: dict[str, object] = json.loads(out.stdout)
    return result


GLIBC = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator only")


@GLIBC
def test_after_tuning_large_buffers_stay_mapped_after_a_larger_one_is_freed() -> None:
    """By default glibc raises its mmap threshold to the largest mapped block freed, so a
    1 MiB buffer after a 20 MiB one comes from the heap (where it fragments it); tuned,
    it is mapped on its own and unmapped when freed."""
    assert _probe("default") == {"tuned": {}, "mapped": 0}
    assert _probe("tuned") == {"tuned": {"MALLOC_MMAP_THRESHOLD_": 256 << 10,
                                         "MALLOC_ARENA_MAX": 2}, "mapped": 1}


@GLIBC
def test_glibc_variables_set_by_the_user_win() -> None:
    assert _probe("tuned", MALLOC_ARENA_MAX="4")["tuned"] == {
        "MALLOC_MMAP_THRESHOLD_": 256 << 10}
    # the user's own threshold is glibc's, fixed too: the 1 MiB buffer is mapped
    assert _probe("tuned", MALLOC_MMAP_THRESHOLD_="524288") == {
        "tuned": {"MALLOC_ARENA_MAX": 2}, "mapped": 1}
    assert _probe("tuned", GPULEDGER_MALLOC_TUNING="off") == {"tuned": {}, "mapped": 0}
