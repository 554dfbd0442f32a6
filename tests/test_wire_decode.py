"""Decoding a poll batch of Arrow messages: read in place, one frame per schema, and
each bad message a dead letter with its own topic, partition and offset."""

from __future__ import annotations

import io
import random
import struct

import polars as pl
import pyarrow as pa
from polars.exceptions import PanicException
from test_simulate import SMALL

from gpuledger.pipeline.arrow_ipc import check_views, read_frame, read_stream
from gpuledger.pipeline.columns import schema_of
from gpuledger.pipeline.facts.telemetry_minutes import prepare
from gpuledger.pipeline.kafka.wire import (
    ARROW,
    FORMAT_HEADER,
    TYPE_HEADER,
    Message,
    decode,
    encode,
    ipc_stream,
)
from gpuledger.pipeline.processor import PARTS_SCHEMA, conform_parts
from gpuledger.pipeline.simulate import SimConfig, parse_cluster, simulate


def _telemetry() -> pl.DataFrame:
    batch = next(iter(simulate(SimConfig(hours=0.2, seed=3, cluster=parse_cluster(SMALL)))))
    return batch["telemetry"]


def _message(offset: int, value: bytes, kind: bytes = b"telemetry") -> Message:
    return Message("t.gpu.telemetry.v1", 2, offset, b"n", value,
                   ((FORMAT_HEADER, ARROW), (TYPE_HEADER, kind)))


def _ipc(frame: pl.DataFrame) -> bytes:
    sink = io.BytesIO()
    frame.write_ipc_stream(sink)
    return sink.getvalue()


def test_messages_of_several_schemas_and_bad_ones_in_one_batch() -> None:
    tel = _telemetry()
    a, b, c = tel.slice(0, 50), tel.slice(50, 70), tel.slice(120, 30)
    # the contract's columns in another order: conformed
    shuffled = c.select(list(reversed(c.columns)))
    messages = [
        _message(10, encode(a, "telemetry")),
        _message(11, b"not arrow at all"),
        _message(12, _ipc(shuffled)),
        _message(13, _ipc(pl.DataFrame({"time": ["yesterday"], "node": [1]}))),
        _message(14, encode(b, "telemetry")),
        _message(15, encode(a.head(3), "inventory"), kind=b"inventory"),
    ]
    got = decode(messages, "telemetry")
    frame = got.frames["telemetry"]
    assert frame.schema == schema_of("telemetry")
    assert frame.height == 150
    key = ["node", "gpu_index", "time"]
    assert frame.sort(key).equals(pl.concat([a, b, c]).sort(key))
    dead = got.dead_letters.sort("offset")
    assert dead["offset"].to_list() == [11, 13, 15]
    assert dead["partition"].to_list() == [2, 2, 2]
    reasons = dead["reason"].to_list()
    assert reasons[0].startswith("unreadable Arrow IPC")
    assert reasons[1].startswith("unreadable Arrow IPC or not the contract's columns")
    assert "gpuledger-type 'inventory'" in reasons[2]


def test_a_bad_record_in_a_message_is_traced_to_that_message() -> None:
    tel = _telemetry()
    good, bad = tel.slice(0, 40), tel.slice(40, 40)
    bad = bad.with_columns(pl.when(pl.int_range(pl.len()) == 7).then(pl.lit(-5.0))
                           .otherwise(pl.col("util_gpu")).alias("util_gpu"))
    shuffled = tel.slice(80, 20).select(list(reversed(tel.columns)))
    got = decode([_message(1, encode(good, "telemetry")), _message(2, _ipc(shuffled)),
                  _message(3, encode(bad, "telemetry"))], "telemetry")
    assert got.frames["telemetry"].height == 99
    assert got.dead_letters["offset"].to_list() == [3]
    assert "util_gpu" in got.dead_letters["reason"][0]


def test_a_message_cut_from_a_large_batch_holds_only_its_own_rows() -> None:
    """A job's rows split from a batch of many jobs: its message was once as large as
    the batch's GPU ids (the strings in ``allocation`` shared the batch's buffers; here
    about 35 KB a message, 433 KB at 9,216 GPUs)."""
    from gpuledger.pipeline.kafka.wire import split_by_key

    sim = SimConfig(hours=0.5, seed=3)  # the default cluster: 576 GPUs
    jobs = next(iter(simulate(sim)))["job"]
    parts = [part for _key, part in split_by_key(jobs, "job_id")]
    assert len(parts) > 20
    values = [encode(part, "job") for part in parts]
    alone = [len(encode(pl.from_dicts(part.to_dicts(), schema=part.schema), "job"))
             for part in parts]
    assert all(len(v) <= 1.25 * n for v, n in zip(values, alone, strict=True)), (
        [len(v) for v in values[:5]], alone[:5])
    decoded = decode([Message("t", 0, i, b"k", v, ((FORMAT_HEADER, ARROW),
                                                   (TYPE_HEADER, b"job")))
                      for i, v in enumerate(values)], "job")
    assert decoded.dead_letters.is_empty()
    got = decoded.frames["job"]
    assert got.sort("job_id", "time", "event").equals(
        jobs.select(got.columns).sort("job_id", "time", "event"))


def test_a_record_of_another_type_names_its_topic_and_partition() -> None:
    """A job record in a JSON-lines message on the telemetry topic: a dead letter whose
    origin says where it was read (topic '' and partition None before)."""
    line = (b'{"v":1,"type":"job","time":"2026-01-05T00:30:00Z","event":"submitted",'
            b'"job_id":"x","team":"t"}\n')
    m = Message("t.gpu.telemetry.v1", 2, 7, b"n", line)
    decoded = decode([m], "telemetry")
    assert decoded.frames["telemetry"].is_empty()
    dead = decoded.dead_letters.row(0, named=True)
    assert dead["reason"] == "a job record on the telemetry topic"
    assert (dead["topic"], dead["partition"]) == ("t.gpu.telemetry.v1", 2)



def _read(value: bytes, fast: bool) -> pa.Table | None:
    """A message's table as the decoder takes it (read, fully validated, views checked),
    or None where that fails."""
    try:
        table = (read_stream(value, {}) if fast
                 else pa.ipc.open_stream(pa.py_buffer(value)).read_all())
        table.validate(full=True)
        check_views(table)
    except Exception:
        return None
    return table


def _bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table.combine_chunks())
    return sink.getvalue()


def _flipped(value: bytes, rng: random.Random, most: int) -> bytes:
    out = bytearray(value)
    for _ in range(rng.randint(1, most)):
        out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def test_a_stream_read_with_its_schema_parsed_once_is_the_stream_read_whole() -> None:
    """``_read_stream`` parses a poll's schema once and reads each message's one batch
    with it; every stream reads as Arrow reads it whole, and what cannot be read whole is
    not read either: cut at every few bytes, bytes flipped, no batch, two batches, a
    dictionary column, the columns in another order."""
    tel = _telemetry().head(12)
    value = encode(tel, "telemetry")
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, tel.to_arrow().schema) as writer:
        for part in tel.to_arrow().to_batches(max_chunksize=5):
            writer.write_batch(part)
    empty = io.BytesIO()
    with pa.ipc.new_stream(empty, tel.to_arrow().schema):
        pass
    cases = [value, sink.getvalue(), empty.getvalue(),
             _ipc(tel.select(list(reversed(tel.columns)))),
             _ipc(tel.with_columns(pl.col("node").cast(pl.Categorical)))]
    cases += [value[:cut] for cut in range(0, len(value), 7)]
    rng = random.Random(11)
    cases += [_flipped(value, rng, 4) for _ in range(300)]
    read = refused = 0
    for case in cases:
        whole, fast = _read(case, fast=False), _read(case, fast=True)
        if whole is None:
            refused += 1
            assert fast is None
        else:
            read += 1
            assert fast is not None and _bytes(fast) == _bytes(whole)   # NaN != NaN
    assert read >= 6 and refused >= 50
    schemas: dict[bytes, pa.Schema] = {}                  # one schema parsed per poll
    for _ in range(3):
        assert read_stream(value, schemas).equals(_read(value, fast=False))
    assert len(schemas) == 1


def test_damaged_arrow_messages_are_dead_letters_never_a_crash() -> None:
    """Bytes flipped anywhere in an Arrow message: the decoder (and what the processor
    does next with the frame) ends each with its rows or a dead letter with the reason.
    Before, some made the process crash at once (a segmentation fault in Polars, reading
    the view of a null string that Arrow's validation does not look at), or panic
    (a time beyond the calendar's range, a field name that is not UTF-8)."""
    tel = _telemetry().head(40)
    value = encode(tel, "telemetry")
    rng = random.Random(5)
    kept = dead = 0
    for offset in range(400):
        got = decode([_message(offset, _flipped(value, rng, 12))], "telemetry")
        frame = got.frames["telemetry"]
        frame.to_dicts()
        prepare(frame)
        kept += frame.height > 0
        dead += got.dead_letters.height > 0
        assert frame.height + got.dead_letters.height > 0
    assert kept > 20 and dead > 200
    # the time of a raw Arrow record may be any 64-bit number: a reason, not a panic
    far = tel.head(2).with_columns(
        pl.Series("time", [-(2**63), 2**63 - 1]).cast(tel.schema["time"]))
    got = decode([_message(1, encode(far, "telemetry"))], "telemetry")
    assert got.frames["telemetry"].is_empty()
    reasons = got.dead_letters["reason"].to_list()
    assert "-9223372036854775808 ms since 1970-01-01 is before" in reasons[0]
    assert "9223372036854775807 ms since 1970-01-01 is more than" in reasons[1]


def test_damaged_attempt_parts_are_refused_never_a_crash() -> None:
    """The owner reads attempt parts with ``read_frame``: Polars' own IPC reader aborted
    the process on some damaged lengths (an allocation of petabytes), 7 of 20 runs of
    300 damaged messages; a dead letter each now."""
    n = 30
    parts = pl.DataFrame({name: [f"job-{i}-of-a-long-name" for i in range(n)]
                          if dtype == pl.String else pl.Series(name, [None] * n).cast(dtype)
                          for name, dtype in PARTS_SCHEMA.items()})
    value = ipc_stream(parts, "uncompressed")
    assert conform_parts(read_frame(value)).equals(parts)
    rng = random.Random(3)
    refused = 0
    for _ in range(300):
        try:
            conform_parts(read_frame(_flipped(value, rng, 8))).to_dicts()
        except (Exception, PanicException):
            refused += 1
    assert refused > 100


def damaged_views(frame: pl.DataFrame) -> bytes:
    """An Arrow stream of ``frame`` whose all-null ``mig_instance`` has the view of a null
    slot pointing far outside its buffers, in a row with a bad value: Arrow's full
    validation passes it (it looks at the slots holding a value), and Polars crashed the
    process on it (a segmentation fault rendering that row for its reject)."""
    middle = frame.height // 2
    table = frame.with_columns(pl.when(pl.int_range(pl.len()) == middle).then(pl.lit(-5.0))
                               .otherwise(pl.col("util_gpu")).alias("util_gpu")).to_arrow()
    i = table.schema.get_field_index("mig_instance")
    column = table.column(i).chunk(0)
    views = bytearray(16 * len(column))
    struct.pack_into("<iiii", views, 16 * middle, 1000, 0, 7, 123456)
    damaged = pa.Array.from_buffers(pa.string_view(), len(column),
                                    [column.buffers()[0], pa.py_buffer(bytes(views))],
                                    null_count=column.null_count)
    table = table.set_column(i, "mig_instance", damaged)
    table.validate(full=True)
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def test_a_null_strings_view_pointing_outside_is_a_dead_letter() -> None:
    tel = _telemetry().head(5)
    assert tel["mig_instance"].null_count() == 5
    got = decode([_message(7, damaged_views(tel)), _message(8, encode(tel, "telemetry"))],
                 "telemetry")
    assert got.frames["telemetry"].height == 5                # the good message's
    assert got.dead_letters["offset"].to_list() == [7]
    assert "a string view points outside its buffers" in got.dead_letters["reason"][0]
