"""Free heap pages go back to the system after a checkpoint (``memory.py``)."""

from __future__ import annotations

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
