"""Decoding a poll batch of Arrow messages: read in place, one frame per schema, and
each bad message a dead letter with its own topic, partition and offset."""

from __future__ import annotations

import io

import polars as pl
from test_simulate import SMALL

from gpuledger.pipeline.columns import schema_of
from gpuledger.pipeline.kafka.wire import ARROW, FORMAT_HEADER, TYPE_HEADER, Message, decode, encode
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
