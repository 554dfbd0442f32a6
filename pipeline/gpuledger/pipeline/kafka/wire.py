"""The wire format of gpuledger's Kafka messages (version 1).

A message carries a batch of records of one type, in one of two encodings, named by the
``gpuledger-format`` header:

- ``jsonl-v1`` — contract JSON lines (``docs/events.md``), one record per line. What the
  node agent sends: no Arrow needed on the node.
- ``arrow-v1`` — an Arrow IPC stream of one frame with exactly the contract's columnar
  schema (``schema_of``); the record type is in the ``gpuledger-type`` header. Compact and
  fast; used by the simulator and by anything that already holds frames.

A message without the header is read as ``jsonl-v1``. Keys: telemetry and inventory by
node, job events by job id. Decoding works on whole poll batches: all JSON-lines values
are joined and decoded in one columnar pass; Arrow values are read as they are.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import numpy as np
import polars as pl
import pyarrow as pa
from polars.exceptions import PanicException

from gpuledger.contract.schema import RECORD_TYPES, RecordType
from gpuledger.pipeline.arrow_ipc import check_views, read_table
from gpuledger.pipeline.columns import conform, empty_frame, schema_of
from gpuledger.pipeline.config import Limits
from gpuledger.pipeline.decode import decode_jsonl, encode_jsonl
from gpuledger.pipeline.validate import REJECT_SCHEMA, validate

FORMAT_HEADER = "gpuledger-format"
TYPE_HEADER = "gpuledger-type"
JSONL = b"jsonl-v1"
ARROW = b"arrow-v1"


@dataclass(frozen=True)
class Message:
    """What the transport needs of one consumed message."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()

    def header(self, name: str) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


@dataclass
class DecodedBatch:
    """Valid frames per record type, and dead letters with their origin."""

    frames: dict[RecordType, pl.DataFrame]
    dead_letters: pl.DataFrame  # REJECT_SCHEMA + topic, partition, offset


DEAD_SCHEMA = pl.Schema({**dict(REJECT_SCHEMA), "topic": pl.String(), "partition": pl.Int64(),
                         "offset": pl.Int64()})


def encode(frame: pl.DataFrame, record_type: RecordType, fmt: bytes = ARROW) -> bytes:
    """One message value holding ``frame``."""
    if fmt == JSONL:
        return encode_jsonl(frame, record_type)
    return ipc_stream(conform(frame, record_type), "uncompressed")


def ipc_stream(frame: pl.DataFrame,
               compression: Literal["uncompressed", "lz4", "zstd"]) -> bytes:
    """``frame`` as an Arrow IPC stream of its own rows only.

    A frame cut from a larger one (a key's rows, ``split_by_key``) shares its strings'
    buffers with it, and Polars writes a string view column with every buffer it points
    into. Flat columns are gathered into fresh buffers, but strings inside lists and
    structs are not: a job event's ``allocation`` carried the whole batch's GPU ids,
    433 KB a message instead of 5 KB at 9,216 GPUs. A stream much larger than the rows'
    own size is therefore written again with plain (offset) strings, which hold only
    their own bytes; others keep string views, which read faster (a telemetry batch
    decodes in two thirds of the time)."""
    sink = io.BytesIO()
    frame.write_ipc_stream(sink, compression="uncompressed")
    if sink.tell() > 2 * frame.estimated_size() + (16 << 10):  # 16 KiB: the schema
        sink = io.BytesIO()
        frame.write_ipc_stream(sink, compression=compression,
                               compat_level=pl.CompatLevel.oldest())
    elif compression != "uncompressed":
        sink = io.BytesIO()
        frame.write_ipc_stream(sink, compression=compression)
    return sink.getvalue()


def split_by_key(frame: pl.DataFrame, key: str) -> Iterator[tuple[str, pl.DataFrame]]:
    """Frames per key value (node or job), in first-seen order."""
    for (value,), part in frame.group_by(key, maintain_order=True):
        yield str(value), part


def decode(messages: Sequence[Message], record_type: RecordType, *,
           now: datetime | None = None, max_future_s: float = 3600,
           limits: Limits | None = None) -> DecodedBatch:
    """Decode messages of one topic; bad records become dead letters, not errors
    (``limits``: the physical bounds of a record, ``config.limits``)."""
    jsonl = [m for m in messages if m.header(FORMAT_HEADER) in (None, JSONL)]
    arrow = [m for m in messages if m.header(FORMAT_HEADER) == ARROW]
    other = [m for m in messages if m.header(FORMAT_HEADER) not in (None, JSONL, ARROW)]
    frames: list[pl.DataFrame] = []
    dead: list[pl.DataFrame] = []
    if jsonl:
        values = [m.value if m.value.endswith(b"\n") else m.value + b"\n" for m in jsonl]
        lines_per = np.fromiter((v.count(b"\n") for v in values), dtype=np.int64,
                                count=len(values))
        decoded = decode_jsonl(b"".join(values), source=jsonl[0].topic, now=now,
                               max_future_s=max_future_s, limits=limits)
        frames.append(decoded.frames[record_type])
        for other_type in RECORD_TYPES:
            if other_type != record_type and decoded.frames[other_type].height:
                dead.append(_wrong_topic(decoded.frames[other_type], other_type, record_type,
                                         jsonl))
        if decoded.rejects.height:
            dead.append(_origin(decoded.rejects, jsonl, lines_per))
    readable, counts, arrow_frames = _read_arrow(arrow, record_type, dead)
    if arrow_frames:
        # one validation for the whole poll batch; row numbers map rejects back
        rows_per = np.asarray(counts, dtype=np.int64)
        batch = pl.concat(arrow_frames).rechunk()  # a chunk per message: one
        row = pl.int_range(1, batch.height + 1, eager=True, dtype=pl.Int64)
        try:
            good, bad = validate(batch, record_type, now=now, max_future_s=max_future_s,
                                 limits=limits,
                                 source=readable[0].topic, line=row)
        except PanicException:  # a value Polars cannot handle: find its message
            good, bad = _validate_each(batch, readable, rows_per, record_type, dead,
                                       now=now, max_future_s=max_future_s, limits=limits)
        frames.append(good)
        if bad.height:
            dead.append(_origin(bad, readable, rows_per).with_columns(
                pl.lit(None, pl.Int64).alias("line")))
    for m in other:
        fmt = (m.header(FORMAT_HEADER) or b"").decode(errors="replace")
        dead.append(message_reject(m, f"unknown gpuledger-format {fmt!r}"))
    valid = pl.concat(frames) if frames else empty_frame(record_type)
    dead_frame = (pl.concat([d.select(DEAD_SCHEMA.names()).cast(DEAD_SCHEMA)
                             for d in dead]) if dead else pl.DataFrame(schema=DEAD_SCHEMA))
    return DecodedBatch({record_type: valid}, dead_frame)


def _validate_each(batch: pl.DataFrame, messages: Sequence[Message], rows_per: np.ndarray,
                   record_type: RecordType, dead: list[pl.DataFrame], **options: Any
                   ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``validate`` message by message, after it failed with a panic of Polars on the
    whole batch: a message whose rows make it panic again is a dead letter with the
    reason, the others are validated as usual (their rejects' lines numbered in the
    whole batch, as ``_origin`` maps them)."""
    goods: list[pl.DataFrame] = []
    bads: list[pl.DataFrame] = []
    start = 0
    for m, n in zip(messages, rows_per.tolist(), strict=True):
        rows = batch.slice(start, n)
        line = pl.int_range(start + 1, start + n + 1, eager=True, dtype=pl.Int64)
        start += n
        try:
            good, bad = validate(rows, record_type, source=m.topic, line=line, **options)
        except PanicException as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            dead.append(message_reject(m, f"a value the processor cannot read: {reason}"))
            continue
        goods.append(good)
        bads.append(bad)
    return (pl.concat(goods) if goods else empty_frame(record_type),
            pl.concat(bads) if bads else pl.DataFrame(schema=REJECT_SCHEMA))


def _read_arrow(messages: Sequence[Message], record_type: RecordType,
                dead: list[pl.DataFrame]
                ) -> tuple[list[Message], list[int], list[pl.DataFrame]]:
    """The Arrow messages' frames; the messages they came from, in that order, and each
    one's rows.

    Each value is read in place (Arrow maps its buffers); the messages of one schema
    become one frame, conformed once if that schema is not the contract's (what
    ``encode`` writes needs nothing). A message that cannot be read, or whose columns
    cannot be made the contract's, is a dead letter with the reason."""
    contract = schema_of(record_type)
    groups: list[tuple[pa.Schema, list[tuple[Message, pa.Table]]]] = []
    schemas: dict[bytes, pa.Schema] = {}
    for m in messages:
        declared = (m.header(TYPE_HEADER) or b"").decode(errors="replace")
        if declared != record_type:
            dead.append(message_reject(m, f"gpuledger-type {declared!r} on topic {m.topic}"))
            continue
        try:
            # checked before anything reads the values (``arrow_ipc.py``): damaged or
            # crafted bytes crashed the service at every restart
            table = read_table(m.value, schemas)
        except Exception as exc:
            dead.append(_unreadable(m, exc))
            continue
        for schema, members in groups:
            if schema.equals(table.schema):
                members.append((m, table))
                break
        else:
            groups.append((table.schema, [(m, table)]))
    readable: list[Message] = []
    counts: list[int] = []
    frames: list[pl.DataFrame] = []
    for _schema, members in groups:
        try:
            # one chunk before Polars: from_arrow of a chunk per message took 3x longer,
            # and the concatenated frame was rechunked after it anyway
            combined = pa.concat_tables([t for _m, t in members]).combine_chunks()
            check_views(combined)
            frame = _frame(combined, record_type, contract)
        except (Exception, PanicException):  # one of them is bad: find it
            for m, table in members:
                try:
                    check_views(table)
                    frames.append(_frame(table, record_type, contract))
                    readable.append(m)
                    counts.append(table.num_rows)
                except (Exception, PanicException) as exc:
                    dead.append(_unreadable(m, exc))
            continue
        frames.append(frame)
        readable.extend(m for m, _t in members)
        counts.extend(t.num_rows for _m, t in members)
    return readable, counts, frames


def _frame(table: pa.Table, record_type: RecordType, contract: pl.Schema) -> pl.DataFrame:
    frame = pl.from_arrow(table, rechunk=False)
    assert isinstance(frame, pl.DataFrame)
    return frame if frame.schema == contract else conform(frame, record_type)


def _unreadable(m: Message, exc: BaseException) -> pl.DataFrame:
    said = str(exc).splitlines()
    return message_reject(m, f"unreadable Arrow IPC or not the contract's columns: "
                     f"{type(exc).__name__}: {said[0] if said else ''}")


def _origin(rejects: pl.DataFrame, messages: Sequence[Message],
            lines_per: np.ndarray) -> pl.DataFrame:
    """Map reject line numbers of the joined batch back to their messages."""
    ends = np.cumsum(lines_per)
    idx = np.searchsorted(ends, rejects["line"].to_numpy() - 1, side="right")
    return rejects.with_columns(
        pl.Series("topic", [messages[i].topic for i in idx], dtype=pl.String),
        pl.Series("partition", [messages[i].partition for i in idx], dtype=pl.Int64),
        pl.Series("offset", [messages[i].offset for i in idx], dtype=pl.Int64),
    )


def message_reject(m: Message, reason: str) -> pl.DataFrame:
    """A dead letter of the whole message ``m``, with ``reason``."""
    return pl.DataFrame({"record_type": [None], "source": [m.topic], "line": [None],
                         "reason": [reason], "raw": [m.value.decode("utf-8", "replace")],
                         "topic": [m.topic], "partition": [m.partition],
                         "offset": [m.offset]}, schema=DEAD_SCHEMA)


def _wrong_topic(frame: pl.DataFrame, found: str, expected: str,
                 messages: Sequence[Message]) -> pl.DataFrame:
    """Dead letters of records of another type than their topic's: their topic, and
    their partition when the messages read came from one (a decoded record does not
    keep its message)."""
    n = frame.height
    partitions = {m.partition for m in messages}
    partition = next(iter(partitions)) if len(partitions) == 1 else None
    return pl.DataFrame({
        "record_type": [found] * n, "source": [""] * n, "line": [None] * n,
        "reason": [f"a {found} record on the {expected} topic"] * n,
        "raw": encode_jsonl(frame, found).decode().splitlines(),  # type: ignore[arg-type]
        "topic": [messages[0].topic] * n, "partition": [partition] * n, "offset": [None] * n,
    }, schema=DEAD_SCHEMA)
