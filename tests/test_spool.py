"""The agent's on-disk spool: order, acknowledgement, restarts, torn writes, bounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuledger.agent.spool import SUFFIX, Spool


def _fill(spool: Spool, n: int, start: int = 0, size: int = 100) -> None:
    for i in range(start, start + n):
        value = f"{i:08d}".encode() * (size // 8)
        spool.append("gpu.telemetry.v1", f"node-{i % 3}".encode(), value)


def _numbers(spool: Spool) -> list[int]:
    return [m.number for m in spool.pending(10**9)]


def test_order_and_acknowledgement(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 12)
    _fill(spool, 100)
    msgs = spool.pending(10)
    assert [m.number for m in msgs] == list(range(10))
    assert msgs[3].key == b"node-0" and msgs[3].value.startswith(b"00000003")
    spool.ack(41)
    assert _numbers(spool) == list(range(42, 100))
    assert spool.backlog == 58
    spool.ack(10)                      # acknowledging the past changes nothing
    assert spool.backlog == 58
    spool.ack(99)
    assert spool.pending() == [] and spool.backlog == 0
    assert len(list(tmp_path.glob(f"*{SUFFIX}"))) == 1   # delivered segments are deleted


def test_survives_restarts_and_keeps_numbering(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=1 << 12)
    _fill(spool, 50)
    spool.ack(19)
    again = Spool(tmp_path, segment_bytes=1 << 12)
    assert _numbers(again) == list(range(20, 50))
    assert again.append("t", b"k", b"v") == 50


def test_a_torn_tail_is_ignored_and_overwritten(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=1 << 20)
    _fill(spool, 5)
    segment = next(tmp_path.glob(f"*{SUFFIX}"))
    with open(segment, "ab") as f:
        f.write(b"\x50\x00\x00\x00partial")   # a crash in the middle of an append
    again = Spool(tmp_path, segment_bytes=1 << 20)
    assert _numbers(again) == [0, 1, 2, 3, 4]
    again.append("t", b"k", b"after")
    assert [m.value for m in again.pending()][-1] == b"after"


def test_full_spool_drops_the_oldest_and_counts_exactly(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=4096, segment_bytes=1024)
    _fill(spool, 200, size=96)          # ~20 KiB into a 4 KiB spool
    kept = _numbers(spool)
    assert kept == list(range(kept[0], 200))          # the newest, in order, no holes
    assert spool.dropped_messages == kept[0]          # exactly the ones not kept
    assert spool.dropped_bytes == kept[0] * 96
    assert spool.bytes_used <= 4096 + 1024
    assert Spool(tmp_path, max_bytes=4096, segment_bytes=1024).pending()[0].number == kept[0]


def test_bad_bounds_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        Spool(tmp_path, max_bytes=10, segment_bytes=100)
