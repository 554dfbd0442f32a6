"""Decoding contract JSON lines into validated columnar frames, and encoding them back.

:func:`decode_jsonl` turns a buffer of JSON lines (record types may be mixed) into one
frame per record type, exactly :func:`~gpuledger.pipeline.columns.schema_of`, plus the
rejects (:data:`~gpuledger.pipeline.validate.REJECT_SCHEMA`) with reasons and line
numbers. :func:`decode_jsonl_files` streams large files chunk by chunk;
:func:`encode_jsonl` writes frames back as contract JSON lines.

How it stays fast (recorded files hold millions of lines):

1. Line boundaries come from a vectorised newline scan (numpy), not from splitting the
   buffer into Python objects.
2. Runs of lines that start with ``{`` are read by Arrow's JSON reader against an
   explicit schema, in parts of 2048 lines on a few threads (Arrow releases the GIL),
   each part a zero-copy slice of the buffer. ``time`` is read as text and parsed
   columnar in :func:`~gpuledger.pipeline.validate.check`. A part counts only if the
   reader returns exactly one row per line, so rows and line numbers stay aligned.
   The schema is that of the most common record type among a few sampled lines; rows
   of another type found on the way (their ``type`` column says so) are read again
   with their own schema.
   Record types with a ``json``-kind field (``inventory``, for ``labels``) cannot be
   read by Arrow and take the line path.
3. One bad line makes Arrow refuse a whole part. When its error names a row, that line
   (and the one before: the error may be noticed one row late) take the line path and
   the lines around are read again; when it does not (a failed number conversion), the
   part is split in 16 and the pieces retried, down to pieces of 64 lines, which take
   the line path; a piece none of whose parts read (errors everywhere) takes it at
   once. A few bad lines cost about one more read of their parts.
4. The line path is the authority on what is accepted: ``orjson`` per line, then a check
   of the JSON type of every contract field. The Arrow reader accepts a subset of what
   the line path accepts and yields the same values (floats are correctly rounded by
   both; its leniencies, ``NaN``/``Infinity`` literals, are matched by the line path and
   a line that holds two values is caught by the row count), so the valid rows of a
   file do not depend on which other lines are in it.
5. Every record type's rows then go through :func:`~gpuledger.pipeline.validate.check`.

Documented choices:

* JSON types are strict: an integer field takes a JSON integer only (``1.0`` and ``"1"``
  are rejected), a number field takes an integer or a fraction, a text field takes a
  string only (a number where text is expected is **rejected**), a boolean field takes
  ``true``/``false`` only.
* The literals ``NaN``, ``Infinity`` and ``-Infinity`` (as Python's ``json.dumps``
  writes them; also ``-NaN``) are read as floats, so that the reject names the field
  ("NaN is not a number") rather than calling the line malformed; numbers that overflow
  a double are malformed.
* Unknown fields are ignored, at the top level and inside ``processes``/``allocation``
  entries; when a key is repeated the last value wins.
* Blank lines (only spaces, tabs, ``\\r``) are skipped; ``\\r\\n`` line ends are fine; a
  UTF-8 byte order mark is skipped at the start of the input (``first_line == 1``) only.
* Lines must be valid UTF-8; rejects carry the original line (a trailing ``\\r``
  removed), undecodable bytes shown as ``\\xNN``.
* The reject's ``record_type`` is the ``type`` the line claims when that is one of the
  contract's record types, else null (so that it stays a bounded label).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np
import numpy.typing as npt
import orjson
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
from polars.datatypes import DataTypeClass

from gpuledger.contract.schema import FIELDS, RECORD_TYPES, RecordType
from gpuledger.pipeline.columns import TIME_DTYPE, conform, empty_frame, schema_of
from gpuledger.pipeline.config import Limits
from gpuledger.pipeline.validate import (
    MIN_TIME,
    REJECT_SCHEMA,
    check,
    empty_rejects,
    format_time,
)

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "Decoded",
    "decode_jsonl",
    "decode_jsonl_files",
    "encode_jsonl",
]

DEFAULT_CHUNK_BYTES = 64 << 20
"""Bytes per chunk in :func:`decode_jsonl_files` (~100k-300k lines of telemetry)."""

_BOM = b"\xef\xbb\xbf"
_SCAN_BLOCK = 1 << 20  # bytes per step of the newline scan (stays in cache)
_ARROW_BLOCK = 16 << 20  # Arrow JSON reader block size; longer lines take the line path
_PART_LINES = 2048  # lines per Arrow read: a bad line costs a re-read of its part only
_SPLIT_WAYS = 16  # a refused part is retried as this many smaller parts...
_MIN_FAST_LINES = 64  # ...until it has at most this many lines: then the line path
_WORKERS = max(1, min(4, os.cpu_count() or 1))  # parallel Arrow reads (GIL released)
_LINE_COLUMN = "__line"
_BLANK = b" \t\r"
MAX_LINE_BYTES = 1 << 20
"""Longer lines are rejected unread (a contract record is a few KiB at most)."""
_RAW_BYTES = 4096  # of an over-long or damaged line, this much is kept as the reject's raw
_FAST_MAX_BRACKETS = 1000  # lines with more '[' and '{' take the line path (nesting depth)


# --------------------------------------------------------------------------- schemas


def _raw_schema(record_type: RecordType) -> pl.Schema:
    """The contract schema with ``time`` as text: what parsing produces before validation."""
    return pl.Schema(
        {
            name: (pl.String() if dtype == TIME_DTYPE else dtype)
            for name, dtype in schema_of(record_type).items()
        }
    )


def _arrow_type(dtype: pl.DataType | DataTypeClass) -> pa.DataType:
    """The Arrow type the JSON reader should produce for a Polars dtype."""
    if dtype == pl.Int64:
        return pa.int64()
    if dtype == pl.Float64:
        return pa.float64()
    if dtype == pl.String:
        return pa.string()
    if dtype == pl.Boolean:
        return pa.bool_()
    if isinstance(dtype, pl.List):
        return pa.list_(_arrow_type(dtype.inner))
    if isinstance(dtype, pl.Struct):
        return pa.struct([(f.name, _arrow_type(f.dtype)) for f in dtype.fields])
    raise TypeError(f"no JSON reader type for {dtype}")


_FAST_TYPES: tuple[RecordType, ...] = tuple(
    t for t in RECORD_TYPES if not any(f.kind == "json" for f in FIELDS[t])
)
"""Record types the Arrow reader parses (Arrow cannot keep a ``json`` object as text)."""

_PARSE_OPTIONS: dict[RecordType, pa_json.ParseOptions] = {
    t: pa_json.ParseOptions(
        explicit_schema=pa.schema(
            [(name, _arrow_type(dtype)) for name, dtype in _raw_schema(t).items()]
        ),
        unexpected_field_behavior="ignore",
    )
    for t in _FAST_TYPES
}
_ERROR_ROW = re.compile(r"in row (\d+)$")
_READ_OPTIONS = pa_json.ReadOptions(block_size=_ARROW_BLOCK, use_threads=False)


# --------------------------------------------------------------------------- result


@dataclass
class Decoded:
    """Result of decoding: valid rows per record type and the rejected lines."""

    frames: dict[RecordType, pl.DataFrame]
    """Valid rows per record type, exactly ``schema_of()``; all three keys present."""
    rejects: pl.DataFrame
    """Rejected lines, :data:`~gpuledger.pipeline.validate.REJECT_SCHEMA`, by line."""

    @staticmethod
    def empty() -> Decoded:
        """No rows, no rejects."""
        return Decoded({t: empty_frame(t) for t in RECORD_TYPES}, empty_rejects())

    @staticmethod
    def concat(parts: Sequence[Decoded]) -> Decoded:
        """Concatenate several results (e.g. the chunks of a file), keeping order."""
        if not parts:
            return Decoded.empty()
        frames = {t: pl.concat([p.frames[t] for p in parts]) for t in RECORD_TYPES}
        return Decoded(frames, pl.concat([p.rejects for p in parts]))

    @property
    def rows(self) -> int:
        """Number of valid rows over all record types."""
        return sum(f.height for f in self.frames.values())


# --------------------------------------------------------------------------- line path


def _describe(value: Any) -> str:
    """A JSON value for a reason: its JSON type and (shortened) text."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"a number {value!r}" if isinstance(value, int) else f"a number {value}"
    if isinstance(value, str):
        text = value if len(value) <= 60 else value[:60] + "..."
        return f"a string {text!r}"
    if isinstance(value, list):
        return "an array"
    return "an object"


_Conv = Callable[[str, Any, list[str]], Any]


def _to_int(name: str, value: Any, problems: list[str]) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if -(2**63) <= value < 2**63:
            return value
        problems.append(f"field '{name}': {value} is out of the 64-bit integer range")
        return None
    problems.append(f"field '{name}': expected an integer, got {_describe(value)}")
    return None


def _to_float(name: str, value: Any, problems: list[str]) -> float | None:
    if value is None:
        return None
    if isinstance(value, float):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            problems.append(f"field '{name}': {value} is out of range")
            return None
    problems.append(f"field '{name}': expected a number, got {_describe(value)}")
    return None


def _to_str(name: str, value: Any, problems: list[str]) -> str | None:
    if value is None or isinstance(value, str):
        return value
    problems.append(f"field '{name}': expected a string, got {_describe(value)}")
    return None


def _to_bool(name: str, value: Any, problems: list[str]) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    problems.append(f"field '{name}': expected true or false, got {_describe(value)}")
    return None


def _to_json_object(name: str, value: Any, problems: list[str]) -> str | None:
    if value is None:
        return None
    if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
        text: str = orjson.dumps(value).decode()
        return text
    problems.append(f"field '{name}': expected an object of strings, got {_describe(value)}")
    return None


def _scalar_converter(dtype: pl.DataType | DataTypeClass) -> _Conv:
    if dtype == pl.Int64:
        return _to_int
    if dtype == pl.Float64:
        return _to_float
    if dtype == pl.Boolean:
        return _to_bool
    if dtype == pl.String:
        return _to_str
    raise TypeError(f"no converter for {dtype}")


def _list_converter(inner: pl.DataType | DataTypeClass) -> _Conv:
    """Converter for a list field: of structs (objects) or of scalars."""
    if isinstance(inner, pl.Struct):
        subs = [(f.name, _scalar_converter(f.dtype)) for f in inner.fields]

        def convert_entry(name: str, value: Any, problems: list[str]) -> dict[str, Any] | None:
            if value is None:
                return None
            if not isinstance(value, dict):
                problems.append(f"field '{name}': expected an object, got {_describe(value)}")
                return None
            return {sub: conv(f"{name}.{sub}", value.get(sub), problems) for sub, conv in subs}

        element: _Conv = convert_entry
    else:
        element = _scalar_converter(inner)

    def convert(name: str, value: Any, problems: list[str]) -> list[Any] | None:
        if value is None:
            return None
        if not isinstance(value, list):
            problems.append(f"field '{name}': expected an array, got {_describe(value)}")
            return None
        return [element(f"{name}[{i}]", v, problems) for i, v in enumerate(value)]

    return convert


def _converters(record_type: RecordType) -> list[tuple[str, _Conv]]:
    """(field name, JSON-to-column converter) for each field of ``record_type``."""
    out: list[tuple[str, _Conv]] = []
    raw = _raw_schema(record_type)
    for field in FIELDS[record_type]:
        dtype = raw[field.name]
        if field.kind == "json":
            out.append((field.name, _to_json_object))
        elif isinstance(dtype, pl.List):
            out.append((field.name, _list_converter(dtype.inner)))
        else:
            out.append((field.name, _scalar_converter(dtype)))
    return out


_CONVERTERS: dict[RecordType, list[tuple[str, _Conv]]] = {t: _converters(t) for t in RECORD_TYPES}


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _check_strings(value: Any) -> None:
    """Raise ValueError if any string in ``value`` is not encodable (lone surrogates)."""
    if isinstance(value, str):
        value.encode("utf-8")
    elif isinstance(value, dict):
        for k, v in value.items():
            k.encode("utf-8")
            _check_strings(v)
    elif isinstance(value, list):
        for v in value:
            _check_strings(v)


_STRING_OR_MINUS_NAN = re.compile(rb'"(?:[^"\\]|\\.)*"|-NaN')


def _plain_nan(match: re.Match[bytes]) -> bytes:
    return b"NaN" if match.group(0) == b"-NaN" else match.group(0)


def _loads(text: bytes) -> Any:
    """Parse one line: orjson, or the standard library when the line uses the
    non-standard ``NaN``/``-NaN``/``Infinity``/``-Infinity`` literals (which the fast
    reader also accepts)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        if b"NaN" in text or b"Infinity" in text:
            try:
                if b"-NaN" in text:  # outside strings only
                    text = _STRING_OR_MINUS_NAN.sub(_plain_nan, text)
                value = json.loads(text.decode("utf-8"), parse_float=_finite_float)
                _check_strings(value)
                return value
            except (ValueError, RecursionError):
                pass
        raise


def _malformed(exc: orjson.JSONDecodeError) -> str:
    """A reason that does not change with the JSON library's version.

    The parser's own wording varies between releases ("invalid literal" vs "invalid
    literal, expected 'null'"): keep its first clause and the position.
    """
    what = exc.msg.split(",")[0].split(":")[0].strip() or "invalid JSON"
    return f"malformed JSON: {what}: line {exc.lineno} column {exc.colno} (char {exc.pos})"


def _parse_line(text: bytes) -> tuple[str | None, dict[str, Any] | None, str | None]:
    """Line path for one line: (claimed type, row in raw-schema form, reject reason)."""
    try:
        obj = _loads(text)
    except orjson.JSONDecodeError as exc:
        return None, None, _malformed(exc)
    if not isinstance(obj, dict):
        return None, None, f"not a JSON object: got {_describe(obj)}"
    claimed = obj.get("type")
    if claimed is None:
        return None, None, "field 'type': required but missing"
    if not isinstance(claimed, str):
        return None, None, f"field 'type': expected a string, got {_describe(claimed)}"
    if claimed not in FIELDS:  # the reject's record_type stays null: labels stay bounded
        known = ", ".join(RECORD_TYPES)
        return None, None, f"field 'type': {claimed!r} is not one of {known}"
    problems: list[str] = []
    row = {name: conv(name, obj.get(name), problems) for name, conv in _CONVERTERS[claimed]}
    if problems:
        return claimed, None, "; ".join(problems)
    return claimed, row, None


# --------------------------------------------------------------------------- buffers


def _line_bounds(
    arr: npt.NDArray[np.uint8],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Start and end (exclusive, without the newline) offsets of every line."""
    size = arr.shape[0]
    parts = [
        np.flatnonzero(arr[lo : lo + _SCAN_BLOCK] == 10).astype(np.int64) + lo
        for lo in range(0, size, _SCAN_BLOCK)
    ]
    newlines = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    starts = np.concatenate((np.zeros(1, dtype=np.int64), newlines + 1))
    ends = np.concatenate((newlines, np.array([size], dtype=np.int64)))
    if starts[-1] == size:  # empty input or trailing newline: no last line
        starts, ends = starts[:-1], ends[:-1]
    return starts, ends


def _bad_utf8_lines(
    view: memoryview,
    arr: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
) -> list[int]:
    """Indices of lines that are not valid UTF-8 (usually none, found fast)."""
    if not any(
        int(arr[lo : lo + _SCAN_BLOCK].max(initial=0)) >= 0x80
        for lo in range(0, arr.shape[0], _SCAN_BLOCK)
    ):
        return []
    try:  # validates the whole buffer in C without copying
        whole = pa.LargeStringArray.from_buffers(
            1, pa.array([0, arr.shape[0]], pa.int64()).buffers()[1], pa.py_buffer(view)
        )
        whole.validate(full=True)
        return []
    except pa.ArrowException:
        pass
    high = np.flatnonzero(arr >= 0x80)
    candidates = np.unique(np.searchsorted(starts, high, side="right") - 1)
    bad: list[int] = []
    for i in candidates.tolist():
        if i < 0:
            continue
        try:
            bytes(view[starts[i] : ends[i]]).decode("utf-8")
        except UnicodeDecodeError:
            bad.append(i)
    return bad


def _raw_text(line: bytes) -> str:
    """A line as reject text: without a trailing CR, undecodable bytes escaped."""
    return line.rstrip(b"\r").decode("utf-8", "backslashreplace")


_Index = npt.NDArray[np.int64]
"""Line indices (0-based, ascending) within a chunk."""
_Level = list[tuple[_Index | None, list[_Index]]]
"""A level of retries: (the refused piece or None, the pieces it was split into)."""


@dataclass
class _Chunk:
    """One buffer being decoded: its lines and where each line goes.

    ``tables`` collects, per fast record type, (line indices, Arrow table) pairs whose
    rows are exactly those lines; ``pending`` collects lines that the Arrow reader saw
    to be of another fast type than the schema it was reading with; ``slow`` collects
    lines for the line path.
    """

    view: memoryview
    starts: npt.NDArray[np.int64]
    ends: npt.NDArray[np.int64]
    tables: dict[RecordType, list[tuple[npt.NDArray[np.int64], pa.Table]]]
    pending: dict[RecordType, list[npt.NDArray[np.int64]]]
    slow: list[int]

    def line(self, i: int) -> bytes:
        return bytes(self.view[int(self.starts[i]) : int(self.ends[i])])

    def buffer(self, idx: npt.NDArray[np.int64]) -> pa.Buffer:
        """The lines ``idx`` as one buffer: a zero-copy slice when they are contiguous."""
        first, last = int(idx[0]), int(idx[-1])
        if last - first + 1 == idx.shape[0]:
            return pa.py_buffer(self.view[int(self.starts[first]) : int(self.ends[last])])
        return pa.py_buffer(b"\n".join(self.line(i) for i in idx.tolist()))

    def read(
        self, idx: npt.NDArray[np.int64], record_type: RecordType
    ) -> tuple[pa.Table | None, int | None]:
        """Read lines ``idx`` with ``record_type``'s schema.

        Returns ``(table, None)``, or ``(None, row)`` when the reader refused the lines
        (``row``: the row its error message names, if any) or a line held more than one
        value (rows and lines must stay aligned).
        """
        buffer = self.buffer(idx)
        options = (
            _READ_OPTIONS
            if buffer.size < _ARROW_BLOCK
            else pa_json.ReadOptions(block_size=buffer.size + 1, use_threads=False)
        )  # one block, so that the row in an error message counts from the first line
        try:
            table = pa_json.read_json(
                pa.BufferReader(buffer),
                read_options=options,
                parse_options=_PARSE_OPTIONS[record_type],
            )
        except pa.ArrowException as exc:
            hint = _ERROR_ROW.search(str(exc))
            return None, int(hint.group(1)) if hint else None
        return (table, None) if table.num_rows == idx.shape[0] else (None, None)

    def read_around(
        self, idx: npt.NDArray[np.int64], record_type: RecordType
    ) -> tuple[
        list[tuple[npt.NDArray[np.int64], pa.Table]], list[int], list[npt.NDArray[np.int64]]
    ]:
        """Read lines ``idx``, stepping around the bad lines that the reader names.

        When the reader's error names row ``r``, lines ``r - 1`` and ``r`` take the line
        path (the error may be noticed one row late) and the lines before and after are
        read again; errors without a row (a failed number conversion) leave their lines
        unresolved. Runs in a worker thread: returns (tables, line-path lines,
        unresolved pieces) instead of recording them.
        """
        tables: list[tuple[npt.NDArray[np.int64], pa.Table]] = []
        slow: list[int] = []
        unresolved: list[npt.NDArray[np.int64]] = []
        todo = [idx]
        while todo:
            piece = todo.pop()
            table, row = self.read(piece, record_type)
            if table is not None:
                tables.append((piece, table))
            elif row is None or row > piece.shape[0]:
                unresolved.append(piece)
            else:
                first_bad = max(row - 1, 0)
                slow.extend(piece[first_bad : row + 1].tolist())
                for rest in (piece[:first_bad], piece[row + 1 :]):
                    if rest.shape[0]:
                        todo.append(rest)
        return tables, slow, unresolved

    def accept(
        self,
        idx: npt.NDArray[np.int64],
        table: pa.Table,
        record_type: RecordType,
        first_pass: bool,
    ) -> None:
        """Keep the rows of ``record_type``; rows that say they are another fast type
        wait in ``pending`` for a read with their own schema (first pass only); the rest
        go to the line path."""
        kinds = table.column("type")
        mine = pc.fill_null(pc.equal(kinds, record_type), False)
        if pc.all(mine).as_py():
            self.tables[record_type].append((idx, table))
            return
        mine_np = mine.to_numpy(zero_copy_only=False)
        if mine_np.any():
            self.tables[record_type].append((idx[mine_np], table.filter(mine)))
        rest = ~mine_np
        if first_pass:
            for other in _FAST_TYPES:
                if other == record_type:
                    continue
                theirs = pc.fill_null(pc.equal(kinds, other), False).to_numpy(zero_copy_only=False)
                if theirs.any():
                    self.pending[other].append(idx[theirs])
                    rest &= ~theirs
        self.slow.extend(idx[rest].tolist())

    def parse(self, idx: npt.NDArray[np.int64], record_type: RecordType, first_pass: bool) -> None:
        """Read lines ``idx`` in parts of :data:`_PART_LINES`, in parallel.

        Bad lines named by the reader's errors are stepped around (:meth:`read_around`).
        Other refused pieces are split in :data:`_SPLIT_WAYS` and retried, level by level,
        until the bad lines are in pieces of at most :data:`_MIN_FAST_LINES` lines, which
        take the line path; a piece none of whose parts could be read (errors everywhere)
        takes the line path at once.
        """
        n_parts = max(1, -(-idx.shape[0] // _PART_LINES))
        level: _Level = [(None, np.array_split(idx, n_parts))]  # (parent, its pieces)
        with ThreadPoolExecutor(_WORKERS) as pool:
            while level:
                pieces = [piece for _, group in level for piece in group]
                outcomes = iter(
                    list(pool.map(lambda piece: self.read_around(piece, record_type), pieces))
                    if len(pieces) > 1
                    else [self.read_around(pieces[0], record_type)]
                )
                next_level: _Level = []
                for parent, group in level:
                    results = [next(outcomes) for _ in group]
                    if parent is not None and not any(tables for tables, _, _ in results):
                        self.slow.extend(parent.tolist())
                        continue
                    for tables, slow, unresolved in results:
                        for piece, table in tables:
                            self.accept(piece, table, record_type, first_pass)
                        self.slow.extend(slow)
                        for piece in unresolved:
                            if piece.shape[0] <= _MIN_FAST_LINES:
                                self.slow.extend(piece.tolist())
                            else:
                                next_level.append((piece, np.array_split(piece, _SPLIT_WAYS)))
                level = next_level


def _sniff(chunk: _Chunk, candidates: _Index) -> RecordType:
    """The record type to read first: the most common among a few sampled lines."""
    votes: dict[RecordType, int] = dict.fromkeys(_FAST_TYPES, 0)
    sample = candidates[np.linspace(0, candidates.shape[0] - 1, num=16).astype(np.int64)]
    for i in np.unique(sample).tolist():
        try:
            claimed = orjson.loads(chunk.line(i)).get("type")
        except (orjson.JSONDecodeError, AttributeError):
            continue
        if isinstance(claimed, str) and claimed in votes:
            votes[claimed] += 1
    return max(_FAST_TYPES, key=lambda t: votes[t])  # ties: the first, telemetry


def _runs(mask: npt.NDArray[np.bool_]) -> list[tuple[int, int]]:
    """Maximal [a, b) runs where ``mask`` is true."""
    if mask.shape[0] == 0:
        return []
    padded = np.concatenate(([False], mask, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist(), strict=True))


# --------------------------------------------------------------------------- decode


def decode_jsonl(
    data: bytes | bytearray | memoryview,
    *,
    source: str = "",
    first_line: int = 1,
    now: datetime | None = None,
    max_future_s: float = 3600,
    min_time: datetime = MIN_TIME,
    limits: Limits | None = None,
) -> Decoded:
    """Decode contract JSON lines (record types may be mixed).

    ``first_line`` is the line number of the buffer's first line (for chunks of a file);
    ``now``, ``max_future_s``, ``min_time`` and ``limits`` are passed to validation
    (``now`` defaults to the wall clock). Valid rows keep their input order within each
    record type; rejects are ordered by line.
    """
    return _decode(
        data,
        source=source,
        first_line=first_line,
        now=now,
        max_future_s=max_future_s,
        min_time=min_time,
        limits=limits,
    )[0]


def _decode(
    data: bytes | bytearray | memoryview,
    *,
    source: str,
    first_line: int,
    now: datetime | None,
    max_future_s: float,
    min_time: datetime,
    limits: Limits | None = None,
) -> tuple[Decoded, int]:
    """:func:`decode_jsonl`, also returning the number of lines (newlines) it read."""
    view = memoryview(data).cast("B")
    if first_line == 1 and view[:3] == _BOM:
        view = view[3:]
    arr = np.frombuffer(view, dtype=np.uint8)
    starts, ends = _line_bounds(arr)
    n_lines = starts.shape[0]
    chunk = _Chunk(
        view,
        starts,
        ends,
        {t: [] for t in _FAST_TYPES},
        {t: [] for t in _FAST_TYPES},
        [],
    )
    reject_rows: list[tuple[str | None, int, str, str]] = []  # type, index, reason, raw

    # Where each line goes: fast candidates start with '{'.
    lengths = ends - starts
    first_byte = np.zeros(n_lines, dtype=np.uint8)
    nonempty = lengths > 0
    first_byte[nonempty] = arr[starts[nonempty]]
    fast = first_byte == ord("{")
    for i in np.flatnonzero(lengths > MAX_LINE_BYTES).tolist():
        fast[i] = False
        nonempty[i] = False  # rejected here, unread
        reject_rows.append((None, i, _too_long(int(lengths[i])),
                            _raw_text(chunk.line(i)[:_RAW_BYTES])))
    for i in np.flatnonzero(fast & (lengths > _FAST_MAX_BRACKETS)).tolist():
        # Arrow reads any nesting; the line path (the authority) refuses more than
        # orjson's depth limit: lines that may nest that deep are left to it
        line = chunk.line(i)
        if line.count(b"[") + line.count(b"{") > _FAST_MAX_BRACKETS:
            fast[i] = False
    for i in _bad_utf8_lines(view, arr, starts, ends):
        if not nonempty[i]:
            continue
        fast[i] = False
        nonempty[i] = False  # neither parsed nor skipped: rejected here
        reject_rows.append((None, i, "line is not valid UTF-8", _raw_text(chunk.line(i))))
    for i in np.flatnonzero(~fast & nonempty).tolist():
        if chunk.line(i).strip(_BLANK):
            chunk.slow.append(i)
    runs = _runs(fast)
    if runs:
        primary = _sniff(chunk, np.flatnonzero(fast))
        for a, b in runs:
            chunk.parse(np.arange(a, b, dtype=np.int64), primary, True)
        for record_type, waiting in chunk.pending.items():
            if waiting:
                chunk.parse(np.sort(np.concatenate(waiting)), record_type, False)

    # Fast rows, in line order, with their line indices.
    raw_frames: dict[RecordType, list[pl.DataFrame]] = {t: [] for t in RECORD_TYPES}
    for record_type, parsed in chunk.tables.items():
        if not parsed:
            continue
        parsed.sort(key=lambda item: int(item[0][0]))
        table = pa.concat_tables([t for _, t in parsed])
        index = np.concatenate([i for i, _ in parsed])
        raw_frames[record_type].append(
            cast(pl.DataFrame, pl.from_arrow(table)).with_columns(
                pl.Series(_LINE_COLUMN, index, dtype=pl.Int64)
            )
        )

    # Line path.
    slow_rows: dict[RecordType, list[dict[str, Any]]] = {t: [] for t in RECORD_TYPES}
    slow_index: dict[RecordType, list[int]] = {t: [] for t in RECORD_TYPES}
    for i in sorted(set(chunk.slow)):
        text = chunk.line(i)
        claimed, row, reason = _parse_line(text)
        if row is None:
            reject_rows.append((claimed, i, reason or "rejected", _raw_text(text)))
        else:
            record_type = cast(RecordType, claimed)
            slow_rows[record_type].append(row)
            slow_index[record_type].append(i)
    for record_type in RECORD_TYPES:
        if slow_rows[record_type]:
            frame = pl.DataFrame(
                slow_rows[record_type], schema=_raw_schema(record_type), orient="row"
            ).with_columns(pl.Series(_LINE_COLUMN, slow_index[record_type], dtype=pl.Int64))
            raw_frames[record_type].append(frame)

    # Validation.
    frames: dict[RecordType, pl.DataFrame] = {}
    for record_type in RECORD_TYPES:
        parts = raw_frames[record_type]
        if not parts:
            frames[record_type] = empty_frame(record_type)
            continue
        frame = parts[0] if len(parts) == 1 else pl.concat(parts).sort(_LINE_COLUMN)
        result = check(
            frame.drop(_LINE_COLUMN),
            record_type,
            now=now,
            max_future_s=max_future_s,
            min_time=min_time,
            limits=limits,
        )
        frames[record_type] = result.valid
        if result.rejected_index.len():
            bad_lines = frame.get_column(_LINE_COLUMN).gather(result.rejected_index).to_list()
            for i, reason in zip(bad_lines, result.reasons.to_list(), strict=True):
                reject_rows.append((record_type, i, reason, _raw_text(chunk.line(i))))

    reject_rows.sort(key=lambda r: r[1])
    rejects = pl.DataFrame(
        {
            "record_type": [r[0] for r in reject_rows],
            "source": [source] * len(reject_rows),
            "line": [first_line + r[1] for r in reject_rows],
            "reason": [r[2] for r in reject_rows],
            "raw": [r[3] for r in reject_rows],
        },
        schema=REJECT_SCHEMA,
    )
    return Decoded(frames, rejects), n_lines


def _open(path: Path) -> BinaryIO:
    """Open a file for reading bytes; ``.gz`` files are decompressed."""
    if path.suffix == ".gz":
        return cast(BinaryIO, gzip.open(path, "rb"))
    return path.open("rb")


_DAMAGE_ERRORS = (EOFError, OSError, zlib.error)
"""What reading a damaged file raises: a truncated gzip stream (``EOFError``), data that
is not gzip or fails its CRC (``gzip.BadGzipFile``, an ``OSError``), corrupt deflate
data (``zlib.error``), an I/O error."""


def _too_long(size: int) -> str:
    return (f"line is {size:,} bytes long, more than the limit of {MAX_LINE_BYTES:,}: "
            "not read")


def _damage_reason(exc: BaseException, lines_kept: int) -> str:
    """The reject reason for a file that could not be read to its end."""
    if isinstance(exc, EOFError):
        what = "the compressed data ends early (a truncated .gz file)"
    elif isinstance(exc, gzip.BadGzipFile) and "Not a gzipped file" in str(exc):
        what = ("what follows the compressed data is not gzip" if lines_kept else
                "not gzip data although the name ends in .gz")
    elif isinstance(exc, gzip.BadGzipFile | zlib.error):
        what = f"the compressed data is damaged ({exc})"
    else:
        what = f"read error ({getattr(exc, 'strerror', None) or exc})"
    if lines_kept:
        return (f"cannot read the file past this line: {what}; the {lines_kept:,} "
                "line(s) before it were read as usual")
    return f"cannot read the file: {what}; nothing was read from it"


@dataclass
class _Block:
    """A piece of a file as :func:`_blocks` reads it, one of:

    * ``lines``: whole lines, each ending in a newline;
    * ``tail``: the last line of the file, which has no newline;
    * ``overlong``: one line longer than :data:`MAX_LINE_BYTES` (``size``), skipped;
      ``data`` holds its start;
    * ``damage``: the file could not be read further (``error``); ``data`` holds the
      start of the line where reading stopped.
    """

    kind: str
    data: bytes | memoryview = b""
    size: int = 0
    error: BaseException | None = None


def _blocks(handle: BinaryIO, chunk_bytes: int) -> Iterator[_Block]:
    """Read ``handle`` in blocks of whole lines of about ``chunk_bytes``; a line longer
    than :data:`MAX_LINE_BYTES` is skipped as it is read (memory stays bounded)."""
    carry = b""  # the start of a line that continues in the next block
    skipped = 0  # bytes of an over-long line read so far (0: none being skipped)
    head = b""  # its start
    while True:
        # A fresh buffer per block: the frames yielded before may still use the
        # previous one (Arrow reads without copying).
        buffer = bytearray(len(carry) + chunk_bytes)
        buffer[: len(carry)] = carry
        got, damage = _fill(handle, memoryview(buffer)[len(carry) :])
        size = len(carry) + got
        start = 0
        if skipped:
            newline = buffer.find(b"\n", 0, size)
            if newline >= 0:
                yield _Block("overlong", head, skipped + newline)
                skipped, start = 0, newline + 1
            else:
                skipped += size
        if not skipped:
            cut = buffer.rfind(b"\n", start, size)
            if cut >= 0:
                yield _Block("lines", memoryview(buffer)[start : cut + 1])
                start = cut + 1
            if size - start > MAX_LINE_BYTES:
                head, skipped = bytes(buffer[start : start + _RAW_BYTES]), size - start
                carry = b""
            else:
                carry = bytes(buffer[start:size])
        else:
            carry = b""
        if damage is not None:
            yield _Block("damage", head if skipped else carry, error=damage)
            return
        if got == 0:
            if skipped:
                yield _Block("overlong", head, skipped)
            elif carry:
                yield _Block("tail", carry)
            return


def decode_jsonl_files(
    paths: Sequence[Path | str],
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    now: datetime | None = None,
    max_future_s: float = 3600,
    min_time: datetime = MIN_TIME,
    limits: Limits | None = None,
) -> Iterator[Decoded]:
    """Decode JSON-lines files chunk by chunk, one :class:`Decoded` per chunk.

    Chunks end at a line boundary after about ``chunk_bytes`` bytes, so memory stays
    bounded; line numbers count from 1 in each file and stay right across chunks; the
    rejects' ``source`` is the file path. ``.gz`` files are read through gzip. ``now``
    is taken once per chunk when not given.

    A line longer than :data:`MAX_LINE_BYTES` is rejected without being held in memory.
    A file that cannot be read to its end (a truncated or corrupt ``.gz``, a plain file
    named ``.gz``, an I/O error) keeps the whole lines read before the damage; the
    damage becomes one reject at the line where reading stopped (its raw text: the
    part of that line that was read, at most 4 KiB), and the next file is read as usual.
    """
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    options: dict[str, Any] = {"now": now, "max_future_s": max_future_s,
                               "min_time": min_time, "limits": limits}
    for path in map(Path, paths):
        source = str(path)
        next_line = 1
        try:
            handle = _open(path)
        except OSError as exc:  # gone or unreadable since the caller looked
            yield _file_reject(source, 1, _damage_reason(exc, 0), b"")
            continue
        with handle:
            for block in _blocks(handle, chunk_bytes):
                if block.kind == "lines":
                    decoded, n_lines = _decode(block.data, source=source,
                                               first_line=next_line, **options)
                    yield decoded
                    next_line += n_lines
                elif block.kind == "tail":
                    yield decode_jsonl(block.data, source=source, first_line=next_line,
                                       **options)
                elif block.kind == "overlong":
                    yield _file_reject(source, next_line, _too_long(block.size), block.data)
                    next_line += 1
                else:
                    assert block.error is not None
                    yield _file_reject(source, next_line,
                                       _damage_reason(block.error, next_line - 1),
                                       block.data[:_RAW_BYTES])


def _file_reject(source: str, line: int, reason: str, raw: bytes | memoryview) -> Decoded:
    """A :class:`Decoded` holding one reject of a line the file reader refused."""
    reject = pl.DataFrame(
        {"record_type": [None], "source": [source], "line": [line], "reason": [reason],
         "raw": [_raw_text(bytes(raw))]},
        schema=REJECT_SCHEMA,
    )
    return Decoded({t: empty_frame(t) for t in RECORD_TYPES}, reject)


def _fill(handle: BinaryIO, target: memoryview) -> tuple[int, BaseException | None]:
    """Read into ``target`` until it is full or the file ends; the bytes read, and the
    error that stopped the reading early (a damaged file), if any. One underlying read
    at a time (``readinto1``), so that an error loses none of the bytes read before."""
    done = 0
    while done < len(target):
        try:
            got = handle.readinto1(target[done:])  # type: ignore[attr-defined]
        except _DAMAGE_ERRORS as exc:
            return done, exc
        if not got:
            break
        done += got
    return done, None


# --------------------------------------------------------------------------- encode


def encode_jsonl(frame: pl.DataFrame, record_type: RecordType) -> bytes:
    """Write a frame of ``record_type`` as contract JSON lines (one per row, each ending
    in a newline).

    Fields come in contract order; ``time`` as ``2026-01-05T00:00:10.000Z``; ``json``
    fields (``labels``) as JSON objects, not strings (their text is embedded as is, so
    it must be valid JSON, as it is in validated frames); nulls are written as
    ``null``; NaN and infinities, which JSON cannot spell, also become ``null``.
    Columnar: no per-row Python.
    """
    frame = conform(frame, record_type)
    if frame.height == 0:
        return b""
    pieces: list[pl.Expr] = []
    segment: list[pl.Expr] = []

    def flush() -> None:
        if segment:
            body = pl.struct(list(segment)).struct.json_encode()
            pieces.append(body.str.strip_prefix("{").str.strip_suffix("}"))
            segment.clear()

    for field in FIELDS[record_type]:
        name = field.name
        if field.kind == "json":
            flush()
            pieces.append(
                pl.concat_str([pl.lit(json.dumps(name) + ":"), pl.col(name).fill_null("null")])
            )
        elif field.kind == "time":
            segment.append(format_time(pl.col(name)).alias(name))
        else:
            segment.append(pl.col(name))
    flush()
    line = pl.concat_str([pl.lit("{"), pl.concat_str(pieces, separator=","), pl.lit("}\n")])
    text = frame.select(line.str.join("").alias("jsonl")).item()
    return cast(str, text).encode("utf-8")
