"""A bounded on-disk spool: the agent's store-and-forward buffer.

Every message the agent produces is appended here first; a sender drains the spool in
order and acknowledges what the broker has accepted. When the broker is unreachable the
spool grows (up to ``max_bytes``), survives agent restarts, and replays in order with
the original timestamps (they are inside the messages). When it is full, the oldest
segment is dropped and exactly how many messages and bytes were lost is counted and
logged. Pure Python, no dependencies: the agent stays lean.

Files in the folder that are not named like a segment are ignored (with a warning); a
folder where a segment, ``cursor`` or a temporary file should be is a start-up error
(:class:`SpoolError`).

Layout of the spool folder::

    00000000000000000042.seg     segments, named by their first message number
    cursor                       number of the next message to send (atomic rewrite)

A segment is a sequence of frames ``[u32 length][u16 topic length][topic][u16 key
length][key][value]``; a torn frame at the end of the newest segment (a crash while
appending) is ignored and overwritten.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("gpuledger.agent.spool")

_HEAD = struct.Struct("<I")
_SHORT = struct.Struct("<H")
SUFFIX = ".seg"
_SEGMENT_NAME = re.compile(r"[0-9]{20}" + re.escape(SUFFIX))


@dataclass(frozen=True)
class Message:
    """One spooled message and its number (strictly increasing, never reused)."""

    number: int
    topic: str
    key: bytes
    value: bytes


def _frame(topic: str, key: bytes, value: bytes) -> bytes:
    t = topic.encode()
    body = _SHORT.pack(len(t)) + t + _SHORT.pack(len(key)) + key + value
    return _HEAD.pack(len(body)) + body


def _read_frames(path: Path) -> tuple[list[tuple[str, bytes, bytes]], int]:
    """Whole frames of a segment and the byte length they cover."""
    data = path.read_bytes()
    out: list[tuple[str, bytes, bytes]] = []
    pos = 0
    while pos + _HEAD.size <= len(data):
        (size,) = _HEAD.unpack_from(data, pos)
        end = pos + _HEAD.size + size
        if end > len(data):
            break  # torn tail
        body = memoryview(data)[pos + _HEAD.size:end]
        (tlen,) = _SHORT.unpack_from(body, 0)
        topic = bytes(body[2:2 + tlen]).decode()
        (klen,) = _SHORT.unpack_from(body, 2 + tlen)
        key = bytes(body[4 + tlen:4 + tlen + klen])
        out.append((topic, key, bytes(body[4 + tlen + klen:])))
        pos = end
    return out, pos


class SpoolError(ValueError):
    """The spool folder cannot be used: one line naming the path and why."""


def check_file(path: Path) -> None:
    """:class:`SpoolError` when something other than a plain file is at ``path``."""
    if path.is_dir():
        raise SpoolError(f"{path} is a folder, not a file: remove it")
    if path.exists() and not path.is_file():
        raise SpoolError(f"{path} is not a plain file: remove it")


class Spool:
    """Append, read in order, acknowledge; bounded by ``max_bytes``."""

    state_files: tuple[str, ...] = ("cursor", ".cursor.tmp")
    """Files the spool writes besides its segments (each must be a plain file)."""

    def __init__(self, folder: Path, max_bytes: int = 256 << 20,
                 segment_bytes: int = 8 << 20) -> None:
        if max_bytes < segment_bytes:
            raise ValueError("spool.max_bytes must be at least spool.segment_bytes")
        self.folder = folder
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.dropped_messages = 0
        self.dropped_bytes = 0
        if folder.exists() and not folder.is_dir():
            raise SpoolError(f"{folder} is a file, not a folder")
        for name in self.state_files:
            check_file(folder / name)
        folder.mkdir(parents=True, exist_ok=True)
        self._segments: list[tuple[int, int, int]] = []  # (first number, count, bytes)
        for path in sorted(folder.glob(f"*{SUFFIX}")):
            if not _SEGMENT_NAME.fullmatch(path.name):
                log.warning("spool: ignoring %s (not a segment name: 20 digits + %s)",
                            path, SUFFIX)
                continue
            check_file(path)
            frames, length = _read_frames(path)
            if length < path.stat().st_size:
                with open(path, "r+b") as f:  # drop a torn tail
                    f.truncate(length)
            self._segments.append((int(path.stem), len(frames), length))
        self.next_number = (self._segments[-1][0] + self._segments[-1][1]
                            if self._segments else 0)
        self.cursor = self._read_cursor()
        if self._segments and self.cursor < self._segments[0][0]:
            self.cursor = self._segments[0][0]

    # -- writing -------------------------------------------------------------------

    def append(self, topic: str, key: bytes, value: bytes) -> int:
        """Store one message; returns its number."""
        frame = _frame(topic, key, value)
        if not self._segments or self._segments[-1][2] + len(frame) > self.segment_bytes:
            self._segments.append((self.next_number, 0, 0))
        first, count, size = self._segments[-1]
        with open(self._path(first), "ab") as f:
            f.write(frame)
        self._segments[-1] = (first, count + 1, size + len(frame))
        number = self.next_number
        self.next_number += 1
        self._enforce_bound()
        return number

    def _enforce_bound(self) -> None:
        while self.bytes_used > self.max_bytes and len(self._segments) > 1:
            first, count, size = self._segments.pop(0)
            unsent = max(0, first + count - max(self.cursor, first))
            if unsent:
                frames, _ = _read_frames(self._path(first))
                self.dropped_messages += unsent
                self.dropped_bytes += sum(len(v) for _, _, v in frames[count - unsent:])
            self._path(first).unlink(missing_ok=True)
            if unsent:
                log.warning("spool full (%d bytes > %d): dropped the oldest %d unsent "
                            "messages (%d dropped in total)", self.bytes_used + size,
                            self.max_bytes, unsent, self.dropped_messages)
            self.cursor = max(self.cursor, first + count)
            self._write_cursor()

    # -- reading -------------------------------------------------------------------

    def pending(self, limit: int = 10_000) -> list[Message]:
        """Up to ``limit`` unacknowledged messages, oldest first."""
        out: list[Message] = []
        for first, count, _size in self._segments:
            if first + count <= self.cursor:
                continue
            frames, _ = _read_frames(self._path(first))
            for i, (topic, key, value) in enumerate(frames):
                number = first + i
                if number >= self.cursor:
                    out.append(Message(number, topic, key, value))
                    if len(out) >= limit:
                        return out
        return out

    def ack(self, through: int) -> None:
        """Messages up to and including number ``through`` were delivered."""
        if through + 1 <= self.cursor:
            return
        self.cursor = through + 1
        self._write_cursor()
        while self._segments and self._segments[0][0] + self._segments[0][1] <= self.cursor \
                and len(self._segments) > 1:
            first = self._segments.pop(0)[0]
            self._path(first).unlink(missing_ok=True)

    # -- state ---------------------------------------------------------------------

    @property
    def bytes_used(self) -> int:
        return sum(size for _, _, size in self._segments)

    @property
    def backlog(self) -> int:
        """Messages stored and not yet acknowledged."""
        return max(0, self.next_number - self.cursor)

    def _path(self, first: int) -> Path:
        return self.folder / f"{first:020d}{SUFFIX}"

    def _read_cursor(self) -> int:
        try:
            return int((self.folder / "cursor").read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def _write_cursor(self) -> None:
        tmp = self.folder / ".cursor.tmp"
        tmp.write_text(str(self.cursor))
        os.replace(tmp, self.folder / "cursor")
