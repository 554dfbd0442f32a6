"""Reading Arrow IPC bytes that may be damaged or crafted (Kafka messages, attempt
parts, saved states), so that they are refused with a reason instead of crashing the
process.

Arrow reads a stream without looking at its values; Polars, reading them, trusts them:
damaged bytes that Arrow read without complaint made the process crash outright (a
segmentation fault reading the view of a null string, an abort on an allocation of
petabytes asked for by a damaged length in Polars' own IPC reader), which no ``except``
can catch. So a stream is read by Arrow, fully validated (every offset, length and UTF-8
string), its string views bounds-checked (null slots too), and only then handed to
Polars.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa


def read_stream(value: bytes, schemas: dict[bytes, pa.Schema]) -> pa.Table:
    """One Arrow IPC stream as a table. A stream of a schema and one record batch (a
    Kafka message of ``kafka/wire.py``, what Polars writes) has its schema parsed once
    per poll (``schemas``: parsed schemas by their bytes): parsing it took three quarters
    of reading a 360-row message (66 µs of 85). Any other stream (dictionaries, several
    batches) is read whole."""
    buffer = pa.py_buffer(value)
    reader = pa.ipc.MessageReader.open_stream(buffer)
    head = reader.read_next_message()
    if head.type == "schema":
        key = head.metadata.to_pybytes()
        schema = schemas.get(key)
        if schema is None:
            schema = schemas[key] = pa.ipc.read_schema(head)
        try:
            body = reader.read_next_message()
        except StopIteration:  # no batch: no records
            return schema.empty_table()
        if body.type == "record batch":
            try:
                reader.read_next_message()
            except StopIteration:  # the stream ends after its one batch
                return pa.Table.from_batches([pa.ipc.read_record_batch(body, schema)], schema)
    return pa.ipc.open_stream(buffer).read_all()


_VIEW_BYTES = 16
"""A string or binary view: length (int32), then the bytes inline up to 12, or a prefix,
the data buffer's index and the offset in it (int32 each)."""
_INLINE = 12


def check_views(table: pa.Table) -> None:
    """Every string and binary view of ``table`` points inside its data buffers, those
    of null slots too (``ValueError`` otherwise). Arrow's full validation looks at the
    slots that hold a value; Polars reads the others' views as well, and a damaged one
    crashed the process (a segmentation fault, not an exception)."""
    for column in table.columns:
        for chunk in column.chunks:
            _check_array_views(chunk)


def _check_array_views(array: pa.Array) -> None:
    kind = array.type
    if pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):
        buffers = array.buffers()
        if not len(array) or buffers[1] is None:
            return
        views = np.frombuffer(buffers[1], dtype=np.int32)
        views = views[: views.size - views.size % 4].reshape(-1, _VIEW_BYTES // 4)
        views = views[array.offset: array.offset + len(array)]
        if len(views) < len(array):
            raise ValueError(f"a view buffer shorter than its {len(array)} slots")
        length, index, start = views[:, 0], views[:, 2], views[:, 3]
        sizes = np.array([b.size if b is not None else 0 for b in buffers[2:]] or [0],
                         dtype=np.int64)
        far = length > _INLINE
        bad = bool((length < 0).any() or (far & ((index < 0) | (index >= len(buffers) - 2)
                                                  | (start < 0))).any())
        if not bad and far.any():
            bad = bool((start[far].astype(np.int64) + length[far]
                        > sizes[index[far]]).any())
        if bad:
            raise ValueError("a string view points outside its buffers")
    elif isinstance(array, pa.ListArray | pa.LargeListArray | pa.FixedSizeListArray):
        _check_array_views(array.values)
    elif isinstance(array, pa.StructArray):
        for i in range(array.type.num_fields):
            _check_array_views(array.field(i))


def read_table(value: bytes, schemas: dict[bytes, pa.Schema]) -> pa.Table:
    """:func:`read_stream`, then Arrow's full validation (every offset, length and UTF-8
    string of the slots that hold a value): what remains to check before Polars reads it
    is its views (:func:`check_views`, once for many tables concatenated)."""
    table = read_stream(value, schemas)
    table.validate(full=True)
    return table


def read_frame(value: bytes) -> pl.DataFrame:
    """An Arrow IPC stream's frame, read safely: every offset, length, string and view
    checked before Polars reads the values (``ValueError`` or Arrow's error otherwise).
    Polars' own IPC reader aborted the process on damaged bytes (an allocation of
    petabytes, asked for by a damaged length), which no ``except`` can catch."""
    table = read_table(value, {})
    check_views(table)
    frame = pl.from_arrow(table, rechunk=False)
    assert isinstance(frame, pl.DataFrame)
    return frame
