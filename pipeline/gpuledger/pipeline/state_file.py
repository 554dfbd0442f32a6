"""The file format of the engine's saved state (checkpoints, ingest states): data only.

A state file is read back without running anything it names. It holds:

- a JSON document of the state's tree: numbers, strings, booleans, null, lists and
  string-keyed objects as themselves; other values as tagged objects ``{"$": tag, ...}``
  (tuples, sets, dicts with other keys, bytes, datetimes, timedeltas, time zones, frames,
  references to a container seen before, and instances of the few engine classes a
  state holds, :data:`CLASSES`, by their attributes);
- the frames, each an Arrow IPC stream (its buffers LZ4-compressed since 2026-12-07;
  uncompressed ones, as earlier versions wrote them, read as well), after the document.

Layout: :data:`MAGIC`, the SHA-256 of the rest (64 hex digits) and a newline; then the
document's length (8 bytes, little-endian) and the document; then per frame its length
(8 bytes) and its stream. Anything else, a damaged file, a tag or class it does not
know, or a frame that is not an Arrow stream, is a :class:`StateFileError` with the
reason; nothing in the file is called.

A container referenced twice (one ``Job`` in two indexes) comes back as one object,
referenced twice: the document numbers containers in the order they are first written,
and a later ``{"$": "ref", "n": k}`` is the k-th again, as pickle's memo does.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import struct
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Any, Literal
from zoneinfo import ZoneInfo

import polars as pl
from polars.exceptions import PanicException

from gpuledger.pipeline.arrow_ipc import read_frame

MAGIC = b"gpuledger state v1 sha256 "
_LENGTH = struct.Struct("<Q")
_UTC_NAMES = ("UTC",)


FRAME_COMPRESSION: Literal["uncompressed", "lz4"] = "lz4"
"""How a state file's frames are written (Arrow IPC's buffer compression; Arrow reads
either). LZ4: a Kafka instance's checkpoint of 12 partitions of 9,216 GPUs, 45 minutes
into an hour, was 159 MB uncompressed, every 10 s, and is 24 MB, its save a third less
CPU (``bench/checkpoint_save.py``)."""

_PLAIN = frozenset({str, int, bool, type(None)})
"""Types written as themselves (a float may be nan or infinite, which JSON lacks)."""


class StateFileError(ValueError):
    """A state file that cannot be read as one (the message says why)."""


class _Writer:
    def __init__(self, classes: dict[str, type]) -> None:
        self.by_type = {cls: name for name, cls in classes.items()}
        self.frames: list[bytes] = []
        self.frame_ids: dict[int, int] = {}
        self.seen: dict[int, int] = {}
        self.keep: list[object] = []  # ids stay unique while the tree is written

    def _mark(self, value: object) -> dict[str, Any] | None:
        """A reference if ``value`` was written before; else number it."""
        n = self.seen.get(id(value))
        if n is not None:
            return {"$": "ref", "n": n}
        self.seen[id(value)] = len(self.seen)
        self.keep.append(value)
        return None

    def value(self, v: Any) -> Any:
        if type(v) in _PLAIN:
            return v
        if isinstance(v, bool | str | int) or v is None:
            return v
        if isinstance(v, float):
            return v if v == v and v not in (float("inf"), float("-inf")) else \
                {"$": "float", "v": repr(v)}
        if isinstance(v, list):
            return self._mark(v) or [x if type(x) in _PLAIN else self.value(x) for x in v]
        if isinstance(v, dict):
            ref = self._mark(v)
            if ref:
                return ref
            if all(type(k) is str and not k.startswith("$") for k in v):
                return {k: x if type(x) in _PLAIN else self.value(x) for k, x in v.items()}
            return {"$": "dict", "v": [[self.value(k), self.value(x)] for k, x in v.items()]}
        if isinstance(v, tuple):
            return {"$": "tuple", "v": [self.value(x) for x in v]}
        if isinstance(v, set | frozenset):
            ref = self._mark(v)
            return ref or {"$": "set" if isinstance(v, set) else "frozenset",
                           "v": [self.value(x) for x in v]}
        if isinstance(v, bytes):
            return {"$": "bytes", "v": base64.b64encode(v).decode()}
        if isinstance(v, datetime):
            return {"$": "datetime", "v": v.replace(tzinfo=None).isoformat(),
                    "tz": self.zone(v.tzinfo)}
        if isinstance(v, timedelta):
            return {"$": "timedelta", "v": [v.days, v.seconds, v.microseconds]}
        if isinstance(v, tzinfo):
            return {"$": "zone", "v": self.zone(v)}
        if isinstance(v, pl.DataFrame):
            return {"$": "frame", "i": self.frame(v)}
        name = self.by_type.get(type(v))
        if name is not None:
            ref = self._mark(v)
            if ref:
                return ref
            getstate = getattr(v, "__getstate__", None)
            state = getstate() if getstate is not None else vars(v)
            if not isinstance(state, dict):
                state = vars(v)
            return {"$": "obj", "class": name, "v": self.value(dict(state))}
        raise TypeError(f"a saved state cannot hold a {type(v).__module__}."
                        f"{type(v).__qualname__}")

    def frame(self, f: pl.DataFrame) -> int:
        i = self.frame_ids.get(id(f))
        if i is None:
            sink = io.BytesIO()
            f.write_ipc_stream(sink, compression=FRAME_COMPRESSION)
            i = self.frame_ids[id(f)] = len(self.frames)
            self.frames.append(sink.getvalue())
            self.keep.append(f)
        return i

    @staticmethod
    def zone(tz: tzinfo | None) -> Any:
        if tz is None:
            return None
        if tz is UTC:
            return "UTC"
        if isinstance(tz, ZoneInfo):
            return {"key": tz.key}
        if isinstance(tz, timezone):
            offset = tz.utcoffset(None)
            return {"offset": [offset.days, offset.seconds, offset.microseconds]}
        raise TypeError(f"a saved state cannot hold the time zone {tz!r}")


def dump(tree: Any, classes: dict[str, type]) -> bytes:
    """``tree`` as a state file; ``classes``: the engine classes it may hold, by name.
    A value of any other type is a ``TypeError`` (a programming error, not input)."""
    writer = _Writer(classes)
    doc = json.dumps(writer.value(tree), separators=(",", ":"), allow_nan=False).encode()
    parts = [_LENGTH.pack(len(doc)), doc]
    for frame in writer.frames:
        parts += [_LENGTH.pack(len(frame)), frame]
    body = b"".join(parts)
    return MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def is_state_file(data: bytes) -> bool:
    return data.startswith(MAGIC)


class _Reader:
    def __init__(self, frames: list[bytes], classes: dict[str, type]) -> None:
        self.raw = frames
        self.frames: dict[int, pl.DataFrame] = {}
        self.classes = classes
        self.seen: list[object] = []
        self.tags: dict[str, Callable[[dict[str, Any]], Any]] = {
            "ref": self._ref, "float": self._float, "dict": self._dict, "tuple": self._tuple,
            "set": self._set, "frozenset": self._frozenset, "bytes": self._bytes,
            "datetime": self._datetime, "timedelta": self._timedelta, "zone": self._zone,
            "frame": self._frame, "obj": self._obj,
        }

    def value(self, v: Any) -> Any:
        if isinstance(v, list):
            out: list[Any] = []
            self.seen.append(out)
            out.extend(self.value(x) for x in v)
            return out
        if isinstance(v, dict):
            tag = v.get("$")
            if tag is None:
                d: dict[str, Any] = {}
                self.seen.append(d)
                d.update((k, self.value(x)) for k, x in v.items())
                return d
            read = self.tags.get(tag) if isinstance(tag, str) else None
            if read is None:
                raise StateFileError(f"unknown tag {str(tag)[:40]!r}")
            return read(v)
        if v is None or isinstance(v, bool | int | float | str):
            return v
        raise StateFileError(f"unexpected value {str(v)[:40]!r}")  # pragma: no cover

    def _ref(self, v: dict[str, Any]) -> Any:
        n = v.get("n")
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n < len(self.seen):
            raise StateFileError(f"a reference to container {str(n)[:20]} before it was "
                                 "written")
        return self.seen[n]

    @staticmethod
    def _float(v: dict[str, Any]) -> float:
        text = v.get("v")
        if text not in ("nan", "inf", "-inf"):
            raise StateFileError(f"float {str(text)[:20]!r} is not nan, inf or -inf")
        return float(text)

    def _dict(self, v: dict[str, Any]) -> dict[Any, Any]:
        d: dict[Any, Any] = {}
        self.seen.append(d)
        for pair in _items(v):
            if not isinstance(pair, list) or len(pair) != 2:
                raise StateFileError("a dict entry is not a [key, value] pair")
            key = self.value(pair[0])
            _hashable(key)
            d[key] = self.value(pair[1])
        return d

    def _tuple(self, v: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(self.value(x) for x in _items(v))

    def _set(self, v: dict[str, Any]) -> set[Any]:
        s: set[Any] = set()
        self.seen.append(s)
        for x in _items(v):
            item = self.value(x)
            _hashable(item)
            s.add(item)
        return s

    def _frozenset(self, v: dict[str, Any]) -> frozenset[Any]:
        holder: list[Any] = []
        self.seen.append(holder)  # numbered as written; a frozenset cannot hold itself
        items = [self.value(x) for x in _items(v)]
        for item in items:
            _hashable(item)
        done = frozenset(items)
        self.seen[self.seen.index(holder)] = done
        return done

    @staticmethod
    def _bytes(v: dict[str, Any]) -> bytes:
        try:
            return base64.b64decode(str(v.get("v")), validate=True)
        except ValueError:
            raise StateFileError("bytes that are not base64") from None

    def _datetime(self, v: dict[str, Any]) -> datetime:
        try:
            when = datetime.fromisoformat(str(v.get("v")))
        except ValueError:
            raise StateFileError(f"time {str(v.get('v'))[:40]!r} is not ISO 8601") from None
        if when.tzinfo is not None:
            raise StateFileError("a time carries its zone apart, not in its text")
        zone = self._zone({"v": v.get("tz")})
        return when if zone is None else when.replace(tzinfo=zone)

    @staticmethod
    def _timedelta(v: dict[str, Any]) -> timedelta:
        parts = v.get("v")
        if (not isinstance(parts, list) or len(parts) != 3
                or not all(isinstance(p, int) and not isinstance(p, bool) for p in parts)):
            raise StateFileError("a timedelta is not [days, seconds, microseconds]")
        try:
            return timedelta(days=parts[0], seconds=parts[1], microseconds=parts[2])
        except OverflowError:
            raise StateFileError("a timedelta out of range") from None

    def _zone(self, v: dict[str, Any]) -> tzinfo | None:
        z = v.get("v")
        if z is None:
            return None
        if z in _UTC_NAMES:
            return UTC
        if isinstance(z, dict) and isinstance(z.get("key"), str):
            try:
                return ZoneInfo(z["key"])
            except (ValueError, OSError, KeyError):
                raise StateFileError(f"time zone {z['key'][:40]!r} is not known") from None
        if isinstance(z, dict) and "offset" in z:
            try:
                return timezone(self._timedelta({"v": z["offset"]}))
            except ValueError:
                raise StateFileError("a time zone offset out of range") from None
        raise StateFileError(f"time zone {str(z)[:40]!r} is not one a state holds")

    def _frame(self, v: dict[str, Any]) -> pl.DataFrame:
        i = v.get("i")
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(self.raw):
            raise StateFileError(f"frame {str(i)[:20]} is not in the file")
        frame = self.frames.get(i)
        if frame is None:
            try:
                frame = read_frame(self.raw[i])  # checked before Polars reads it
            except (Exception, PanicException) as exc:
                raise StateFileError(f"frame {i} is not an Arrow IPC stream "
                                     f"({type(exc).__name__})") from None
            self.frames[i] = frame
        return frame

    def _obj(self, v: dict[str, Any]) -> Any:
        name = v.get("class")
        cls = self.classes.get(name) if isinstance(name, str) else None
        if cls is None:
            raise StateFileError(f"class {str(name)[:60]!r} is not one a state holds")
        obj: Any = object.__new__(cls)
        self.seen.append(obj)
        state = self.value(v.get("v"))
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise StateFileError(f"the attributes of a {name} are not a dict")
        if getattr(cls, "__setstate__", None) is not None:
            obj.__setstate__(state)
        else:
            obj.__dict__.update(state)
        return obj


def _items(v: dict[str, Any]) -> list[Any]:
    items = v.get("v")
    if not isinstance(items, list):
        raise StateFileError(f"a {v.get('$')} without its items")
    return items


def _hashable(value: Any) -> None:
    try:
        hash(value)
    except TypeError:
        raise StateFileError(f"a {type(value).__name__} as a key or set item") from None


def load(data: bytes, classes: dict[str, type]) -> Any:
    """The tree of a state file (``classes``: the engine classes it may hold, by name);
    :class:`StateFileError` with the reason when it is not one or is damaged."""
    if not data.startswith(MAGIC):
        raise StateFileError("not a gpuledger state file")
    head = len(MAGIC) + 65
    digest, body = data[len(MAGIC):head - 1], data[head:]
    if data[head - 1:head] != b"\n" or hashlib.sha256(body).hexdigest().encode() != digest:
        raise StateFileError("damaged (its SHA-256 does not match its content: cut short "
                             "or changed since it was written)")
    chunks: list[bytes] = []
    at = 0
    while at < len(body):
        if at + _LENGTH.size > len(body):
            raise StateFileError("cut short")
        (n,) = _LENGTH.unpack_from(body, at)
        at += _LENGTH.size
        if at + n > len(body):
            raise StateFileError("cut short")
        chunks.append(body[at:at + n])
        at += n
    if not chunks:
        raise StateFileError("empty")
    try:
        doc = json.loads(chunks[0])
    except (ValueError, RecursionError):
        raise StateFileError("its document is not JSON") from None
    try:
        return _Reader(chunks[1:], classes).value(doc)
    except RecursionError:
        raise StateFileError("nested too deeply") from None
