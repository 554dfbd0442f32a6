"""The agent's on-disk spool: order, acknowledgement, restarts, torn writes, bounds, a
full disk, damaged segments."""

from __future__ import annotations

import builtins
import errno
import logging
import os
import struct
from pathlib import Path
from typing import Any

import pytest

from gpuledger.agent import spool as spool_module
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


# -- a full disk and damaged segments --------------------------------------------------


class _Disk:
    """Appends made through the spool module's ``open`` find room for ``room`` more
    bytes (``None``: no limit); a write beyond it writes what fits, then fails with
    ENOSPC, like a full file system."""

    def __init__(self) -> None:
        self.room: int | None = None

    def open(self, path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = builtins.open(path, mode, *args, **kwargs)  # noqa: SIM115 (the caller closes it)
        if "a" not in mode:
            return f
        disk = self

        class Limited:
            def __enter__(self) -> Limited:
                return self

            def __exit__(self, *exc: object) -> None:
                f.close()

            def close(self) -> None:
                f.close()

            def write(self, data: Any) -> int:
                data = bytes(data)
                if disk.room is None or len(data) <= disk.room:
                    if disk.room is not None:
                        disk.room -= len(data)
                    f.write(data)
                    return len(data)
                f.write(data[:disk.room])
                f.flush()
                disk.room = 0
                raise OSError(errno.ENOSPC, "No space left on device")

        return Limited()


def _value(i: int) -> bytes:
    return f"{i:08d}".encode() * 12          # 96 bytes, as _fill's


def _full_disk(monkeypatch: pytest.MonkeyPatch) -> _Disk:
    disk = _Disk()
    monkeypatch.setattr(spool_module, "open", disk.open, raising=False)
    return disk


def test_a_full_disk_leaves_the_segment_as_it_was(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    disk = _full_disk(monkeypatch)
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 16)
    _fill(spool, 3)
    segment = next(tmp_path.glob(f"*{SUFFIX}"))
    disk.room = 150                          # one more frame, then 29 bytes of the next
    assert spool.append("gpu.telemetry.v1", b"n", _value(3)) == 3
    good = segment.stat().st_size
    for lost in (100, 101):                  # part of a frame, then nothing at all
        with pytest.raises(OSError) as failed:
            spool.append("gpu.telemetry.v1", b"n", _value(lost))
        assert failed.value.errno == errno.ENOSPC
        assert segment.stat().st_size == good            # no half frame left behind
    disk.room = None                         # the operator frees space
    assert [spool.append("gpu.telemetry.v1", b"n", _value(i)) for i in (4, 5, 6)] \
        == [4, 5, 6]
    expected = [_value(i)[:8] for i in range(7)]
    assert [m.value[:8] for m in spool.pending()] == expected
    assert all(len(m.value) == 96 for m in spool.pending())  # nothing glued on
    assert spool.backlog == 7 and spool.failed_appends == 2
    assert spool.dropped_messages == 0                       # not a full spool
    size = segment.stat().st_size
    again = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 16)
    assert [(m.number, m.value[:8]) for m in again.pending()] == list(enumerate(expected))
    assert again.backlog == 7 and segment.stat().st_size == size  # nothing cut off
    assert not list(tmp_path.glob("*.damaged*"))


def test_a_full_disk_when_a_new_segment_starts(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    disk = _full_disk(monkeypatch)
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=4096)
    _fill(spool, 32, size=96)                # 32 x 126 bytes: the next one starts a segment
    disk.room = 10
    with pytest.raises(OSError):
        spool.append("gpu.telemetry.v1", b"n", _value(99))
    assert [p.name for p in tmp_path.glob(f"*{SUFFIX}")] == [f"{0:020d}{SUFFIX}"]
    disk.room = None
    assert spool.append("gpu.telemetry.v1", b"n", _value(32)) == 32
    assert sorted(p.name for p in tmp_path.glob(f"*{SUFFIX}")) \
        == [f"{0:020d}{SUFFIX}", f"{32:020d}{SUFFIX}"]
    again = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=4096)
    assert _numbers(again) == list(range(33))
    assert again.pending(100)[32].value == _value(32)


def test_appends_wait_until_a_failed_append_is_cut_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = _full_disk(monkeypatch)
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 16)
    _fill(spool, 2)
    segment = next(tmp_path.glob(f"*{SUFFIX}"))
    good = segment.stat().st_size
    real_truncate = os.truncate
    refusals = [2]

    def truncate(path: Any, length: int) -> None:
        if refusals[0]:
            refusals[0] -= 1
            raise OSError(errno.EIO, "Input/output error")
        real_truncate(path, length)

    monkeypatch.setattr(os, "truncate", truncate)
    disk.room = 30
    with pytest.raises(OSError):                 # ENOSPC, and the cut fails too
        spool.append("gpu.telemetry.v1", b"n", _value(100))
    assert segment.stat().st_size == good + 30
    disk.room = None
    with pytest.raises(OSError):                 # the cut fails again: nothing written
        spool.append("gpu.telemetry.v1", b"n", _value(101))
    assert segment.stat().st_size == good + 30
    assert spool.append("gpu.telemetry.v1", b"n", _value(2)) == 2
    assert segment.stat().st_size == good + len(
        spool_module._frame("gpu.telemetry.v1", b"n", _value(2)))
    assert [m.value for m in spool.pending()] == [_value(i) for i in range(3)]
    assert _numbers(Spool(tmp_path, segment_bytes=1 << 16)) == [0, 1, 2]


def _bad_topic_frame() -> bytes:
    body = struct.pack("<H", 4) + b"\xff\xfe\xfd\xfc" + struct.pack("<H", 0) + b"{}"
    return struct.pack("<I", len(body)) + body


def _long_topic_frame() -> bytes:
    body = struct.pack("<H", 500) + b"abc"   # a topic length beyond its frame
    return struct.pack("<I", len(body)) + body


@pytest.mark.parametrize("bad", [_bad_topic_frame(), _long_topic_frame(),
                                 struct.pack("<I", 0)], ids=["utf8", "length", "empty"])
def test_a_damaged_frame_is_set_aside(tmp_path: Path, bad: bytes,
                                      caplog: pytest.LogCaptureFixture) -> None:
    spool = Spool(tmp_path, segment_bytes=1 << 20)
    _fill(spool, 3)
    segment = next(tmp_path.glob(f"*{SUFFIX}"))
    good = segment.stat().st_size
    after = spool_module._frame("gpu.telemetry.v1", b"n", b"after the damage")
    with open(segment, "ab") as f:
        f.write(bad + after)
    with caplog.at_level(logging.WARNING, logger="gpuledger.agent.spool"):
        again = Spool(tmp_path, segment_bytes=1 << 20)          # starts
    assert [m.value for m in again.pending()] == [_value(i) for i in range(3)]
    assert segment.stat().st_size == good                       # cut to whole frames
    aside = segment.with_name(segment.name + ".damaged")
    assert aside.read_bytes() == bad + after                    # kept for a look
    warning = caplog.text
    assert segment.name in warning and aside.name in warning
    assert f"{len(bad + after)} bytes" in warning and "kept the 3 whole frames" in warning
    assert again.append("t", b"k", b"new") == 3
    assert [m.value for m in Spool(tmp_path).pending()][-1] == b"new"
    assert not list(tmp_path.glob("*.damaged.*"))


def test_a_damaged_older_segment_keeps_the_rest(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    spool = Spool(tmp_path, segment_bytes=4096)
    _fill(spool, 40, size=96)                # segments of 32 and 8 messages
    first = tmp_path / f"{0:020d}{SUFFIX}"
    data = first.read_bytes()
    first.write_bytes(data[:10 * 126] + _long_topic_frame() + data[11 * 126:])
    (tmp_path / f"{0:020d}{SUFFIX}.damaged").write_bytes(b"an earlier one")
    with caplog.at_level(logging.WARNING, logger="gpuledger.agent.spool"):
        again = Spool(tmp_path, segment_bytes=4096)
    assert _numbers(again) == list(range(10)) + list(range(32, 40))
    assert "messages 10 to 31 are lost" in caplog.text
    aside = tmp_path / f"{0:020d}{SUFFIX}.damaged.2"
    assert aside.read_bytes() == _long_topic_frame() + data[11 * 126:]
    assert (tmp_path / f"{0:020d}{SUFFIX}.damaged").read_bytes() == b"an earlier one"
    assert again.append("t", b"k", b"v") == 40


def test_a_torn_frame_in_an_older_segment_is_set_aside(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=4096)
    _fill(spool, 40, size=96)
    first = tmp_path / f"{0:020d}{SUFFIX}"
    first.write_bytes(first.read_bytes()[:5 * 126 + 50])
    again = Spool(tmp_path, segment_bytes=4096)
    assert _numbers(again) == list(range(5)) + list(range(32, 40))
    assert len((tmp_path / f"{0:020d}{SUFFIX}.damaged").read_bytes()) == 50


def test_numbers_already_sent_are_not_used_again(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=1 << 20)
    _fill(spool, 5)
    spool.ack(4)
    (tmp_path / "cursor").write_text("9")    # four acknowledged messages are gone
    again = Spool(tmp_path, segment_bytes=1 << 20)
    assert again.append("t", b"k", b"new") == 9
    assert [(m.number, m.value) for m in again.pending()] == [(9, b"new")]
    assert [(m.number, m.value) for m in Spool(tmp_path).pending()] == [(9, b"new")]


def test_a_full_disk_is_freed_by_the_segments_an_ack_deletes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Found with a real tmpfs filled by an outage's backlog: ack wrote the cursor first,
    the write failed (ENOSPC), the delivered segments were never deleted and the disk
    stayed full; every later cycle failed, and a restart sent the whole backlog again.
    Now the delivered segments go first, which makes the room the cursor needs."""
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1024)
    _fill(spool, 40, size=96)                        # 126-byte frames: 5 segments
    full = {"on": True}                              # no room until a segment goes
    write = Spool._write_cursor
    unlink = Path.unlink

    def cursor(self: Spool) -> None:
        if full["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        write(self)

    def freeing(path: Path, missing_ok: bool = False) -> None:
        if path.suffix == SUFFIX:
            full["on"] = False
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Spool, "_write_cursor", cursor)
    monkeypatch.setattr(Path, "unlink", freeing)
    spool.ack(31)                                    # 4 segments delivered whole
    assert sorted(p.name for p in tmp_path.glob(f"*{SUFFIX}")) == [f"{32:020d}{SUFFIX}"]
    assert (tmp_path / "cursor").read_text() == "32"
    # a disk full of something else: the cursor is said once and saved when it can be
    full["on"] = True
    spool.ack(35)
    spool.ack(36)
    assert (tmp_path / "cursor").read_text() == "32"
    assert sum("cannot write the cursor" in r.getMessage() for r in caplog.records) == 1
    full["on"] = False
    spool.append("gpu.telemetry.v1", b"n", _value(40))
    assert (tmp_path / "cursor").read_text() == "37"
    assert _numbers(Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1024)) == \
        list(range(37, 41))


@pytest.mark.parametrize(("code", "refused"), [(errno.EROFS, True), (errno.EACCES, True),
                                               (errno.ENOSPC, False)])
def test_a_folder_it_cannot_write_in_is_refused_at_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, refused: bool) -> None:
    """A spool folder on a read-only file system started, warned at every cycle and
    stored nothing; a full disk still starts (the spool waits for room)."""
    def failing(self: Path, data: bytes) -> int:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(Path, "write_bytes", failing)
    if refused:
        with pytest.raises(spool_module.SpoolError,
                           match=rf"^{tmp_path}: cannot write in it \({os.strerror(code)}\)$"):
            Spool(tmp_path)
    else:
        assert Spool(tmp_path).backlog == 0
