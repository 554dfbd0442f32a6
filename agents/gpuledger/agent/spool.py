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
appending) is cut off at start-up, with a warning, and overwritten.

A failed append (a full disk, an I/O error) raises its :class:`OSError` and leaves the
spool exactly as before it: the partly written frame is cut off again, the message is
not stored and gets no number, and the following appends are stored and read back in
order once the disk has room. If even the cut fails, it is retried before the next
append, and appends keep failing until it succeeds, so that no frame is ever written
after a partial one. A message whose append failed is not counted in
``dropped_messages`` (that counts what a full spool dropped); ``failed_appends`` counts
them, and the caller decides: the agent logs the failed cycle and goes on.

A damaged segment does not stop the spool. Reading a segment stops at the first frame
that cannot be whole (a topic or key length beyond the frame, a topic that is not UTF-8,
a frame too short to hold them, or a frame running past the end of a segment that is not
the newest); the whole frames before it are kept, and the bytes from it to the end of the
segment are set aside in ``<segment>.damaged`` (``.damaged.2``, ... when that exists),
which the spool never reads again, with a warning that names the segment, the file, the
frames kept and the bytes set aside (and the message numbers lost, when a later segment
shows them). The segment is cut to its whole frames; nothing after the damage is
guessed at. A number already acknowledged is never used again: when the cursor is beyond
the newest message left, numbering continues from the cursor in a new segment (without
this, new messages would count as sent and never be sent). A damaged length
field that points past the end of the newest segment cannot be told from a torn tail,
and is cut off like one.
"""

from __future__ import annotations

import contextlib
import errno
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


def _parse(body: memoryview) -> tuple[str, bytes, bytes] | str:
    """One frame's body as (topic, key, value), or why it is damaged."""
    if len(body) < 2 * _SHORT.size:
        return f"a frame of {len(body)} bytes, too short to be one"
    (tlen,) = _SHORT.unpack_from(body, 0)
    if 2 * _SHORT.size + tlen > len(body):
        return f"a topic length of {tlen} beyond the frame ({len(body)} bytes)"
    try:
        topic = bytes(body[2:2 + tlen]).decode()
    except UnicodeDecodeError:
        return "a topic that is not UTF-8"
    (klen,) = _SHORT.unpack_from(body, 2 + tlen)
    if 4 + tlen + klen > len(body):
        return f"a key length of {klen} beyond the frame ({len(body)} bytes)"
    return topic, bytes(body[4 + tlen:4 + tlen + klen]), bytes(body[4 + tlen + klen:])


_TORN = "a torn frame (it runs past the end of the file)"


def _scan(data: bytes) -> tuple[list[tuple[str, bytes, bytes]], int, str | None]:
    """Whole frames, the byte length they cover, and why reading stopped before the end
    (``None``: it did not; :data:`_TORN`: the last frame runs past the end; else the
    damage). Never raises for what the bytes say."""
    out: list[tuple[str, bytes, bytes]] = []
    pos = 0
    while pos < len(data):
        if pos + _HEAD.size > len(data):
            return out, pos, _TORN
        (size,) = _HEAD.unpack_from(data, pos)
        end = pos + _HEAD.size + size
        if end > len(data):
            return out, pos, _TORN
        frame = _parse(memoryview(data)[pos + _HEAD.size:end])
        if isinstance(frame, str):
            return out, pos, frame
        out.append(frame)
        pos = end
    return out, pos, None


def _read_frames(path: Path) -> tuple[list[tuple[str, bytes, bytes]], int]:
    """Whole frames of a segment and the byte length they cover (up to any damage)."""
    frames, length, _problem = _scan(path.read_bytes())
    return frames, length


def _write_all(path: Path, data: bytes) -> None:
    """Append ``data`` to ``path`` unbuffered, so that a failure is seen at once."""
    with open(path, "ab", buffering=0) as f:
        view = memoryview(data)
        while view:
            view = view[f.write(view):]


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
        self.failed_appends = 0
        """Appends that raised (a full disk): those messages were not stored."""
        self._uncut: tuple[Path, int] | None = None  # a failed append not yet cut off
        self._cursor_stale = False  # the cursor file is behind (its write failed)
        paths = []
        for path in sorted(folder.glob(f"*{SUFFIX}")):
            if not _SEGMENT_NAME.fullmatch(path.name):
                log.warning("spool: ignoring %s (not a segment name: 20 digits + %s)",
                            path, SUFFIX)
                continue
            check_file(path)
            paths.append(path)
        for i, path in enumerate(paths):
            data = path.read_bytes()
            frames, length, problem = _scan(data)
            first = int(path.stem)
            if problem is not None:
                following = int(paths[i + 1].stem) if i + 1 < len(paths) else None
                self._cut_at_start(path, data, length, problem, first, len(frames),
                                   following)
            self._segments.append((first, len(frames), length))
        self.next_number = (self._segments[-1][0] + self._segments[-1][1]
                            if self._segments else 0)
        self.cursor = self._read_cursor()
        if self._segments and self.cursor < self._segments[0][0]:
            self.cursor = self._segments[0][0]
        if self.cursor > self.next_number:      # never reuse a number already sent
            self.next_number = self.cursor
        self._check_writable()

    def _check_writable(self) -> None:
        """A folder the spool cannot write in (a read-only file system, no permission)
        is a start-up error: the agent ran, warned at every cycle and stored nothing
        (and its /healthz said no collection had completed). A full disk is not: the
        spool waits for room."""
        probe = self.folder / ".cursor.tmp"   # written and removed: nothing left behind
        try:
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise SpoolError(f"{self.folder}: cannot write in it "
                                 f"({exc.strerror or exc})") from None
            log.warning("spool: cannot write in %s (%s): the spool waits for room",
                        self.folder, exc)

    def _cut_at_start(self, path: Path, data: bytes, length: int, problem: str,
                      first: int, kept: int, following: int | None) -> None:
        """Cut a segment to its whole frames; set aside what follows unless it is the
        torn tail of the newest segment (an append interrupted by a crash)."""
        cut = len(data) - length
        if problem == _TORN and following is None:
            log.warning("spool: %s: cut off a torn frame of %d bytes at the end (an "
                        "append was interrupted); kept %d whole frames", path, cut, kept)
        else:
            aside = path.with_name(path.name + ".damaged")
            n = 1
            while aside.exists() or aside.is_symlink():
                n += 1
                aside = path.with_name(f"{path.name}.damaged.{n}")
            try:
                with open(aside, "xb") as f:
                    f.write(data[length:])
                where = f"set aside in {aside}"
            except OSError as exc:
                where = f"could not be set aside ({exc}) and are discarded"
            lost = ""
            if following is not None and following > first + kept:
                lost = f"; messages {first + kept} to {following - 1} are lost"
            log.warning("spool: %s is damaged at byte %d (%s): kept the %d whole frames "
                        "before it; the %d bytes from there to the end %s%s", path,
                        length, problem, kept, cut, where, lost)
        try:
            os.truncate(path, length)
        except OSError as exc:
            raise SpoolError(f"{path}: cannot cut it to its {length} good bytes: "
                             f"{exc.strerror or exc}") from exc

    # -- writing -------------------------------------------------------------------

    def append(self, topic: str, key: bytes, value: bytes) -> int:
        """Store one message; returns its number. An :class:`OSError` (a full disk)
        leaves the spool as it was: the message is not stored and gets no number."""
        frame = _frame(topic, key, value)
        if self._uncut is not None:             # an earlier failure left part of a frame
            try:
                os.truncate(*self._uncut)
            except OSError:
                self.failed_appends += 1
                raise
            self._uncut = None
        last = self._segments[-1] if self._segments else None
        if (last is None or last[0] + last[1] != self.next_number
                or (last[2] > 0 and last[2] + len(frame) > self.segment_bytes)):
            self._segments.append((self.next_number, 0, 0))
        first, count, size = self._segments[-1]
        path = self._path(first)
        try:
            _write_all(path, frame)
        except OSError:
            self.failed_appends += 1
            self._undo(path, count, size)
            raise
        self._segments[-1] = (first, count + 1, size + len(frame))
        number = self.next_number
        self.next_number += 1
        self._enforce_bound()
        if self._cursor_stale:
            self._save_cursor()
        return number

    def _undo(self, path: Path, count: int, size: int) -> None:
        """Cut a failed append's partial frame off again (retried before the next
        append when even that fails)."""
        try:
            if path.exists():
                os.truncate(path, size)
        except OSError as exc:
            self._uncut = (path, size)
            log.warning("spool: cannot cut a failed append off %s (%s): appends fail "
                        "until it can be", path, exc)
            return
        if count == 0:                          # a new, still empty segment: forget it
            self._segments.pop()
            with contextlib.suppress(OSError):  # an empty segment is harmless
                path.unlink(missing_ok=True)

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
            self._save_cursor()         # a stale cursor file is corrected at start-up

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
        """Messages up to and including number ``through`` were delivered.

        The segments now wholly delivered are deleted first, then the cursor is
        written: on a full disk the deletions make the room the cursor needs (written
        first, it failed, nothing was deleted, and the disk stayed full for good). A
        cursor that still cannot be written is said once and written at the next ack
        or append; a restart meanwhile re-sends what the stale cursor file does not
        count (the processor drops repeats)."""
        if through + 1 <= self.cursor:
            return
        self.cursor = through + 1
        while self._segments and self._segments[0][0] + self._segments[0][1] <= self.cursor \
                and len(self._segments) > 1:
            first = self._segments.pop(0)[0]
            self._path(first).unlink(missing_ok=True)
        self._save_cursor()

    def _save_cursor(self) -> None:
        """Write the cursor; a failure is logged once (until a write works again)."""
        try:
            self._write_cursor()
        except OSError as exc:
            if not self._cursor_stale:
                log.warning("spool: cannot write the cursor (%s): tried again at the next "
                            "send; a restart before then sends some messages again", exc)
            self._cursor_stale = True
        else:
            self._cursor_stale = False

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
