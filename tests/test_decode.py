"""Tests for gpuledger.pipeline.decode: JSON lines to validated frames and back."""

from __future__ import annotations

import gzip
import random
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest

from gpuledger.contract.schema import RECORD_TYPES
from gpuledger.pipeline.columns import schema_of
from gpuledger.pipeline.decode import Decoded, decode_jsonl, decode_jsonl_files, encode_jsonl
from gpuledger.pipeline.validate import REJECT_SCHEMA

NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
DOCS = Path(__file__).resolve().parents[1] / "docs" / "events.md"


# ----------------------------------------------------------------------------- inputs


def telemetry(seq: int, /, **extra: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "v": 1,
        "type": "telemetry",
        "time": f"2026-01-05T10:{seq // 60 % 60:02d}:{seq % 60:02d}.{seq % 1000:03d}Z",
        "node": f"gpu-node-{seq % 3:02d}",
        "seq": seq,
        "agent": "agent-1",
        "gpu_index": seq % 8,
        "gpu_uuid": f"GPU-{seq % 8:04d}-aaaa",
        "card_type": "H100-SXM5-80GB",
        "util_gpu": 87.5,
        "sm_active": 0.61,
        "sm_occupancy": 0.35,
        "tensor_active": 0.22,
        "dram_active": 0.4,
        "mem_used_mib": 61234.5,
        "mem_total_mib": 81559.0,
        "power_w": 612.3,
        "temp_c": 66.0,
        "sm_clock_mhz": 1980.0,
        "pcie_rx_bytes_s": 1.5e9,
        "pcie_tx_bytes_s": 2.5e8,
        "nvlink_rx_bytes_s": 4.0e10,
        "nvlink_tx_bytes_s": 3.9e10,
        "xid_errors": 0,
        "ecc_sbe": 0,
        "ecc_dbe": 0,
        "healthy": True,
        "processes": [{"pid": 4242 + seq, "used_mib": 61000.0, "job_id": f"job-{seq % 4}"}],
    }
    rec.update(extra)
    return rec


def inventory(node: str, **extra: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "v": 1,
        "type": "inventory",
        "time": "2026-01-05T10:00:00Z",
        "node": node,
        "pool": "train",
        "card_type": "H100-SXM5-80GB",
        "gpu_count": 8,
        "gpu_mem_mib": 81559.0,
        "nvlink_domain": "nvl-1",
        "topology": "nvlink",
        "labels": {"rack": "r12", "zone": "a"},
        "schedulable": True,
        "health": "ok",
        "unhealthy_gpus": [3],
    }
    rec.update(extra)
    return rec


def job(event: str, job_id: str, **extra: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "v": 1,
        "type": "job",
        "time": "2026-01-05T10:05:00+01:00",
        "event": event,
        "job_id": job_id,
    }
    if event == "submitted":
        rec.update(
            team="vision",
            user="ana",
            queue="research",
            pool="train",
            priority=50,
            job_type="training",
            gpus=2,
            card_type="H100-SXM5-80GB",
            gpu_mem_mib=40000.0,
            preemptible=True,
            checkpointable=True,
            borrowed=False,
        )
    if event == "started":
        rec["allocation"] = [
            {"node": "gpu-node-00", "gpu_index": 0, "gpu_uuid": "GPU-0000-aaaa", "fraction": 1},
            {"node": "gpu-node-00", "gpu_index": 1, "gpu_uuid": "GPU-0001-aaaa", "fraction": 0.5},
        ]
    rec.update(extra)
    return rec


def dumps(rec: dict[str, Any]) -> bytes:
    return orjson.dumps(rec)


def valid_records() -> list[dict[str, Any]]:
    """A mix of every record type, with nested fields."""
    return [
        inventory("gpu-node-00"),
        telemetry(1),
        telemetry(2, processes=[]),
        job("submitted", "job-1"),
        telemetry(3, mig_instance="1g.10gb/7", util_gpu=None),
        job("started", "job-1"),
        inventory("gpu-node-01", labels=None, unhealthy_gpus=[]),
        telemetry(4, processes=[{"pid": 7, "used_mib": None, "job_id": None}]),
        job("preempted", "job-1", reason="reclaimed by team nlp"),
        job("requeued", "job-1"),
        telemetry(5),
        job("finished", "job-1"),
    ]


def valid_lines() -> list[bytes]:
    return [dumps(r) for r in valid_records()]


def join(lines: list[bytes]) -> bytes:
    return b"\n".join(lines) + b"\n"


def decode(data: bytes, **kwargs: Any) -> Decoded:
    return decode_jsonl(data, now=NOW, **kwargs)


def assert_same_frames(a: Decoded, b: Decoded) -> None:
    for record_type in RECORD_TYPES:
        assert a.frames[record_type].schema == schema_of(record_type)
        assert a.frames[record_type].equals(b.frames[record_type]), record_type


# ----------------------------------------------------------------------------- bad lines


def _at(index: int) -> str:
    return f"line 1 column {index + 1} (char {index})"


_TWO_VALUES = dumps(telemetry(9)) + dumps(telemetry(10))
_OVERFLOW = dumps(telemetry(30)).replace(b'"temp_c":66.0', b'"temp_c":1e400')

# (line, expected reason, expected record_type of the reject)
BAD_LINES: list[tuple[bytes, str, str | None]] = [
    (
        b'{"v":1,"type":"telemetry","time":"2026-01-05T10:00:00Z"',
        "malformed JSON: unexpected end of data: line 1 column 56 (char 55)",
        None,
    ),
    (b"not json at all", "malformed JSON: invalid literal: line 1 column 1 (char 0)", None),
    (
        _TWO_VALUES,
        "malformed JSON: unexpected content after document: " + _at(len(dumps(telemetry(9)))),
        None,
    ),
    (b"[1, 2, 3]", "not a JSON object: got an array", None),
    (b'"telemetry"', "not a JSON object: got a string 'telemetry'", None),
    (b"null", "not a JSON object: got null", None),
    (b'{"v":1,"time":"2026-01-05T10:00:00Z"}', "field 'type': required but missing", None),
    (
        dumps({**telemetry(11), "type": "gpu"}),
        "field 'type': 'gpu' is not one of telemetry, inventory, job",
        None,
    ),
    (dumps({**telemetry(11), "type": 7}), "field 'type': expected a string, got a number 7", None),
    (
        dumps(telemetry(12, seq="12")),
        "field 'seq': expected an integer, got a string '12'",
        "telemetry",
    ),
    (
        dumps(telemetry(13, seq=13.0)),
        "field 'seq': expected an integer, got a number 13.0",
        "telemetry",
    ),
    (
        dumps(telemetry(14, util_gpu="87%")),
        "field 'util_gpu': expected a number, got a string '87%'",
        "telemetry",
    ),
    (
        dumps(telemetry(15, node=15)),
        "field 'node': expected a string, got a number 15",
        "telemetry",
    ),
    (
        dumps(telemetry(16, healthy=1)),
        "field 'healthy': expected true or false, got a number 1",
        "telemetry",
    ),
    (
        dumps(telemetry(17, processes={"pid": 1})),
        "field 'processes': expected an array, got an object",
        "telemetry",
    ),
    (
        dumps(telemetry(18, processes=[{"pid": "1", "used_mib": 1.0}])),
        "field 'processes[0].pid': expected an integer, got a string '1'",
        "telemetry",
    ),
    (
        dumps({k: v for k, v in telemetry(19).items() if k != "node"}),
        "field 'node': required but missing",
        "telemetry",
    ),
    (dumps(telemetry(20, gpu_uuid=None)), "field 'gpu_uuid': required but missing", "telemetry"),
    (dumps(telemetry(21, node="")), "field 'node': required but empty", "telemetry"),
    (
        dumps(telemetry(22, util_gpu=-1)),
        "field 'util_gpu': -1.0 is below the minimum 0",
        "telemetry",
    ),
    (
        dumps(telemetry(23, util_gpu=140)),
        "field 'util_gpu': 140.0 is above the maximum 100",
        "telemetry",
    ),
    (dumps(telemetry(24, seq=-5)), "field 'seq': -5 is below the minimum 0", "telemetry"),
    (
        dumps(telemetry(25, processes=[{"pid": -3, "used_mib": 1.0, "job_id": "j"}])),
        "field 'processes': pid -3 is negative",
        "telemetry",
    ),
    (
        dumps(telemetry(26, processes=[{"pid": 3, "used_mib": -1.0, "job_id": "j"}])),
        "field 'processes': used_mib -1.0 is negative",
        "telemetry",
    ),
    (
        dumps(telemetry(27, processes=[{"used_mib": 1.0}])),
        "field 'processes': an entry has no pid",
        "telemetry",
    ),
    (
        dumps(telemetry(28)).replace(b'"mem_used_mib":61234.5', b'"mem_used_mib":NaN'),
        "field 'mem_used_mib': NaN is not a number",
        "telemetry",
    ),
    (
        dumps(telemetry(29)).replace(b'"power_w":612.3', b'"power_w":-Infinity'),
        "field 'power_w': -inf is not finite",
        "telemetry",
    ),
    (
        _OVERFLOW,
        "malformed JSON: number is infinity when parsed as double: "
        + _at(_OVERFLOW.index(b"1e400")),
        None,
    ),
    (
        dumps(telemetry(31, time="2031-01-01T00:00:00Z")),
        "field 'time': 2031-01-01T00:00:00Z is more than 3600 s in the future",
        "telemetry",
    ),
    (
        dumps(telemetry(32, time="1999-12-31T23:59:59.5Z")),
        "field 'time': 1999-12-31T23:59:59.500Z is before 2000-01-01T00:00:00Z",
        "telemetry",
    ),
    (
        dumps(telemetry(33, time="2026-13-01T00:00:00Z")),
        "field 'time': '2026-13-01T00:00:00Z' is not an RFC 3339 time",
        "telemetry",
    ),
    (
        dumps(telemetry(34, time="2026-02-30T00:00:00Z")),
        "field 'time': '2026-02-30T00:00:00Z' is not an RFC 3339 time",
        "telemetry",
    ),
    (
        dumps(telemetry(35, time="2026-01-05T10:00:00")),
        "field 'time': '2026-01-05T10:00:00' is not an RFC 3339 time",
        "telemetry",
    ),
    (
        dumps(telemetry(36, time="2026-01-05 10:00:00Z")),
        "field 'time': '2026-01-05 10:00:00Z' is not an RFC 3339 time",
        "telemetry",
    ),
    (
        dumps(telemetry(37, time=1767607200)),
        "field 'time': expected a string, got a number 1767607200",
        "telemetry",
    ),
    (
        dumps(telemetry(38, v=2)),
        "field 'v': unsupported contract version 2 (this processor reads v=1)",
        "telemetry",
    ),
    (
        dumps({k: v for k, v in telemetry(39).items() if k != "v"}),
        "field 'v': required but missing",
        "telemetry",
    ),
    (
        dumps(job("exploded", "job-9")),
        "field 'event': 'exploded' is not one of submitted, started, checkpointed, preempted,"
        " requeued, finished, failed, cancelled",
        "job",
    ),
    (
        dumps(job("started", "job-9", allocation=None)),
        "field 'allocation': a 'started' event needs a non-empty allocation",
        "job",
    ),
    (
        dumps(job("started", "job-9", allocation=[])),
        "field 'allocation': a 'started' event needs a non-empty allocation",
        "job",
    ),
    (
        dumps(job("started", "job-9", allocation=[{"node": "n", "gpu_index": 0, "fraction": 1.5}])),
        "field 'allocation': fraction 1.5 is not in (0, 1]",
        "job",
    ),
    (
        dumps(job("started", "job-9", allocation=[{"node": "n", "gpu_index": 0, "fraction": 0}])),
        "field 'allocation': fraction 0.0 is not in (0, 1]",
        "job",
    ),
    (
        dumps(job("started", "job-9", allocation=[{"gpu_index": 0}])),
        "field 'allocation': an entry has no node",
        "job",
    ),
    (
        dumps(job("started", "job-9", allocation=[{"node": "n", "gpu_index": -1}])),
        "field 'allocation': gpu_index -1 is negative",
        "job",
    ),
    (
        dumps(job("submitted", "job-9", job_type="batch")),
        "field 'job_type': 'batch' is not one of training, fine-tune, evaluation, inference,"
        " interactive",
        "job",
    ),
    (
        dumps(inventory("n9", labels={"rack": 12})),
        "field 'labels': expected an object of strings, got an object",
        "inventory",
    ),
    (
        dumps(inventory("n9", labels="rack=12")),
        "field 'labels': expected an object of strings, got a string 'rack=12'",
        "inventory",
    ),
    (
        dumps(inventory("n9", health="meh", unhealthy_gpus=[8])),
        "field 'health': 'meh' is not one of ok, degraded, down; "
        "field 'unhealthy_gpus': 8 is not below gpu_count 8",
        "inventory",
    ),
    (
        dumps(telemetry(40, seq="x", node=1)),
        "field 'node': expected a string, got a number 1; "
        "field 'seq': expected an integer, got a string 'x'",
        "telemetry",
    ),
    (
        dumps(telemetry(41, util_gpu=140, temp_c=-60, node=None)),
        "field 'node': required but missing; field 'util_gpu': 140.0 is above the maximum 100; "
        "field 'temp_c': -60.0 is below the minimum -50",
        "telemetry",
    ),
    (b'{"v":1,"type":"telemetry","node":"\xff\xfe"}', "line is not valid UTF-8", None),
]


@pytest.mark.parametrize(
    ("bad", "reason", "record_type"), BAD_LINES, ids=[r for _, r, _ in BAD_LINES]
)
def test_each_bad_line_is_rejected_with_reason_and_line_number(
    bad: bytes, reason: str, record_type: str | None
) -> None:
    good = valid_lines()
    clean = decode(join(good))
    for position in (0, 5, len(good)):
        lines = [*good[:position], bad, *good[position:]]
        decoded = decode(join(lines), source="test.jsonl")
        assert decoded.rejects.schema == REJECT_SCHEMA
        assert decoded.rejects.to_dicts() == [
            {
                "record_type": record_type,
                "source": "test.jsonl",
                "line": position + 1,
                "reason": reason,
                "raw": bad.decode("utf-8", "backslashreplace"),
            }
        ]
        assert_same_frames(decoded, clean)


def test_all_bad_lines_together_keep_their_line_numbers() -> None:
    good = valid_lines()
    lines: list[bytes] = []
    expected: list[tuple[int, str]] = []
    for i, (bad, reason, _) in enumerate(BAD_LINES):
        lines.append(good[i % len(good)])
        lines.append(bad)
        expected.append((len(lines), reason))
    decoded = decode(join(lines))
    assert list(zip(decoded.rejects["line"], decoded.rejects["reason"], strict=True)) == expected
    reference = decode(join([good[i % len(good)] for i in range(len(BAD_LINES))]))
    assert_same_frames(decoded, reference)


def random_telemetry(rng: random.Random, seq: int) -> dict[str, Any]:
    """Telemetry with awkward floats, to compare the fast and the line path exactly."""
    rec = telemetry(seq)
    for name in ("util_gpu", "power_w", "mem_used_mib", "pcie_rx_bytes_s"):
        rec[name] = rng.choice(
            [rng.random() * 100, round(rng.random() * 100, 2), rng.randrange(0, 100)]
        )
    for name in ("sm_active", "sm_occupancy"):
        rec[name] = float(f"{rng.random():.17g}")
    rec["processes"] = [
        {"pid": rng.randrange(1, 1 << 30), "used_mib": rng.random() * 40000, "job_id": None}
        for _ in range(rng.randrange(0, 3))
    ]
    rec["node"] = rng.choice(["a", "b", "é-node", "节点", 'quo"te'])
    return rec


def test_fast_path_and_line_path_give_identical_rows() -> None:
    # Clean input takes the columnar fast path. With a type error on every other line
    # the whole input takes the per-line path instead; the valid rows must be equal.
    rng = random.Random(7)
    records = [random_telemetry(rng, i) for i in range(400)]
    records[50:50] = [job("submitted", "j-1"), job("started", "j-1"), inventory("a")]
    good = [dumps(r) for r in records]
    clean = decode(join(good))
    assert clean.rejects.is_empty()
    assert clean.frames["telemetry"].height == 400
    bad = dumps(telemetry(1, seq="nope"))
    noisy = decode(join([x for line in good for x in (line, bad)]))
    assert noisy.rejects.height == len(good)
    assert noisy.rejects["line"].to_list() == list(range(2, 2 * len(good) + 1, 2))
    assert_same_frames(noisy, clean)
    # ...and a few bad lines only: most of the input stays on the fast path.
    sparse = list(good)
    for pos in (3, 200, 399):
        sparse.insert(pos, bad)
    assert_same_frames(decode(join(sparse)), clean)


def test_scattered_bad_lines_in_a_large_input() -> None:
    # Several Arrow parts; bad lines that Arrow names by row (type errors, syntax
    # errors), that it does not (a float for an integer) and that it would misread
    # (two values on a line) are all found, and nothing else changes.
    rng = random.Random(5)
    good = [dumps(random_telemetry(rng, i)) for i in range(6000)]
    good[100:100] = [dumps(job("submitted", f"j-{i}")) for i in range(3)]
    clean = decode(join(good))
    bads = [
        dumps(telemetry(1, seq="x")),
        dumps(telemetry(1, seq=1.5)),
        dumps(telemetry(2)) + dumps(telemetry(3)),
        dumps(telemetry(4)) + b"x",
        b'{"v":1,"type":"job"',
        dumps(job("submitted", "j", gpus="2")),
    ]
    lines = list(good)
    for pos in sorted(rng.sample(range(len(good)), 40), reverse=True):
        lines.insert(pos, rng.choice(bads))
    bad_lines = [i + 1 for i, line in enumerate(lines) if line in bads]
    decoded = decode(join(lines))
    assert decoded.rejects["line"].to_list() == bad_lines
    assert_same_frames(decoded, clean)


def test_nan_literal_rejected_alike_on_both_paths() -> None:
    nan_line = dumps(telemetry(3)).replace(b'"util_gpu":87.5', b'"util_gpu":NaN')
    unknown_nan = dumps(telemetry(4))[:-1] + b',"spare":NaN}'
    alone = decode(join([*valid_lines(), nan_line, unknown_nan]))
    bad = dumps(telemetry(1, seq="nope"))
    dense = decode(join([nan_line, bad, unknown_nan, bad]))
    for decoded, lines in ((alone, [13, None]), (dense, [1, 3])):
        reasons = dict(zip(decoded.rejects["line"], decoded.rejects["reason"], strict=True))
        assert reasons[lines[0]] == "field 'util_gpu': NaN is not a number"
        assert lines[1] not in reasons  # NaN in an unknown field is ignored
    assert dense.frames["telemetry"].get_column("seq").to_list() == [4]


def test_unknown_fields_are_ignored() -> None:
    plain = valid_records()
    extended = []
    for rec in plain:
        rec = dict(rec)
        rec["zz_future_field"] = {"nested": [1, 2, {"x": None}]}
        rec["another"] = "text"
        if rec.get("processes"):
            rec["processes"] = [{**p, "container": "c1"} for p in rec["processes"]]
        if rec.get("allocation"):
            rec["allocation"] = [{**a, "mig": "1g"} for a in rec["allocation"]]
        extended.append(rec)
    a = decode(join([dumps(r) for r in plain]))
    b = decode(join([dumps(r) for r in extended]))
    assert a.rejects.is_empty() and b.rejects.is_empty()
    assert_same_frames(b, a)


def test_mixed_types_keep_input_order_and_values() -> None:
    decoded = decode(join(valid_lines()))
    assert decoded.rejects.is_empty()
    assert {t: f.height for t, f in decoded.frames.items()} == {
        "telemetry": 5,
        "inventory": 2,
        "job": 5,
    }
    tel = decoded.frames["telemetry"]
    assert tel["seq"].to_list() == [1, 2, 3, 4, 5]
    assert tel["processes"].to_list()[3] == [{"pid": 7, "used_mib": None, "job_id": None}]
    assert tel["util_gpu"].to_list()[2] is None
    jobs = decoded.frames["job"]
    assert jobs["event"].to_list() == ["submitted", "started", "preempted", "requeued", "finished"]
    assert jobs["time"][0] == datetime(2026, 1, 5, 9, 5, tzinfo=UTC)  # +01:00 to UTC
    assert jobs["allocation"][1].to_list() == [
        {"node": "gpu-node-00", "gpu_index": 0, "gpu_uuid": "GPU-0000-aaaa", "fraction": 1.0},
        {"node": "gpu-node-00", "gpu_index": 1, "gpu_uuid": "GPU-0001-aaaa", "fraction": 0.5},
    ]
    inv = decoded.frames["inventory"]
    assert inv["labels"].to_list() == ['{"rack":"r12","zone":"a"}', None]
    assert inv["unhealthy_gpus"].to_list() == [[3], []]


def test_fraction_defaults_to_whole_gpu() -> None:
    rec = job("started", "j", allocation=[{"node": "n", "gpu_index": 2}])
    decoded = decode(dumps(rec))
    assert decoded.frames["job"]["allocation"][0].to_list() == [
        {"node": "n", "gpu_index": 2, "gpu_uuid": None, "fraction": 1.0}
    ]


def test_time_forms() -> None:
    times = {
        "2026-01-05T10:00:00Z": datetime(2026, 1, 5, 10, tzinfo=UTC),
        "2026-01-05t10:00:00.25z": datetime(2026, 1, 5, 10, 0, 0, 250000, tzinfo=UTC),
        "2026-01-05T10:00:00.123456789-02:30": datetime(2026, 1, 5, 12, 30, 0, 123000, tzinfo=UTC),
        "2026-01-05T11:00:00+01:00": datetime(2026, 1, 5, 10, tzinfo=UTC),
    }
    decoded = decode(join([dumps(telemetry(i, time=t)) for i, t in enumerate(times)]))
    assert decoded.rejects.is_empty()
    assert decoded.frames["telemetry"]["time"].to_list() == list(times.values())


def test_future_horizon_is_configurable() -> None:
    line = dumps(telemetry(1, time="2026-01-05T13:00:00Z"))  # NOW + 1 h
    assert decode(line).rejects.is_empty()
    rejects = decode(line, max_future_s=60).rejects
    assert rejects["reason"].to_list() == [
        "field 'time': 2026-01-05T13:00:00Z is more than 60 s in the future"
    ]


def test_blank_lines_crlf_and_bom() -> None:
    lines = valid_lines()
    data = b"\xef\xbb\xbf" + b"\r\n".join([lines[0], b"", b"   \t", *lines[1:]]) + b"\r\n\r\n"
    decoded = decode(data)
    assert decoded.rejects.is_empty()
    assert_same_frames(decoded, decode(join(lines)))
    # Line numbers count blank lines; a CR is not part of the reject's raw text.
    bad = decode(b"\n\n" + b"[]\r\n")
    assert bad.rejects.select("line", "raw").to_dicts() == [{"line": 3, "raw": "[]"}]
    # A byte order mark is only skipped at the very start of the input.
    later = decode(lines[1] + b"\n\xef\xbb\xbf" + lines[2])
    assert later.rejects["line"].to_list() == [2]
    assert later.rejects["reason"][0].startswith("malformed JSON")


def test_empty_input() -> None:
    for data in (b"", b"\n", b"  \n\n"):
        decoded = decode(data)
        assert decoded.rows == 0 and decoded.rejects.is_empty()
        for record_type in RECORD_TYPES:
            assert decoded.frames[record_type].schema == schema_of(record_type)


def test_first_line_offsets_line_numbers() -> None:
    decoded = decode(join([valid_lines()[1], b"oops"]), first_line=1001)
    assert decoded.rejects["line"].to_list() == [1002]


# ----------------------------------------------------------------------------- encode


@pytest.mark.parametrize("record_type", RECORD_TYPES)
def test_encode_decode_round_trip(record_type: str) -> None:
    frame = decode(join(valid_lines())).frames[record_type]  # type: ignore[index]
    assert frame.height >= 2
    encoded = encode_jsonl(frame, record_type)  # type: ignore[arg-type]
    again = decode(encoded)
    assert again.rejects.is_empty()
    assert again.frames[record_type].equals(frame)  # type: ignore[index]
    assert encode_jsonl(again.frames[record_type], record_type) == encoded  # type: ignore[index,arg-type]


def test_encode_writes_contract_json() -> None:
    frames = decode(join(valid_lines())).frames
    tel = orjson.loads(encode_jsonl(frames["telemetry"], "telemetry").splitlines()[0])
    assert tel["time"] == "2026-01-05T10:00:01.001Z"
    assert list(tel)[:3] == ["v", "type", "time"]
    assert tel["processes"] == [{"pid": 4243, "used_mib": 61000.0, "job_id": "job-1"}]
    inv_lines = encode_jsonl(frames["inventory"], "inventory").splitlines()
    assert orjson.loads(inv_lines[0])["labels"] == {"rack": "r12", "zone": "a"}
    assert orjson.loads(inv_lines[1])["labels"] is None
    assert list(orjson.loads(inv_lines[0])) == list(schema_of("inventory").names())
    assert encode_jsonl(frames["job"].clear(), "job") == b""


def test_encode_round_trips_awkward_values() -> None:
    rng = random.Random(3)
    records = [random_telemetry(rng, i) for i in range(200)]
    frame = decode(join([dumps(r) for r in records])).frames["telemetry"]
    again = decode(encode_jsonl(frame, "telemetry")).frames["telemetry"]
    assert again.equals(frame)


# ----------------------------------------------------------------------------- files


def test_chunked_files_keep_line_numbers(tmp_path: Path) -> None:
    good = valid_lines()
    lines: list[bytes] = []
    bad_at: list[int] = []
    for i in range(40):
        lines.append(good[i % len(good)])
        if i % 7 == 3:
            lines.append(b'{"broken": ')
            bad_at.append(len(lines))
        if i % 11 == 5:
            lines.append(b"")
    data = b"\n".join(lines)  # no newline at the end
    path = tmp_path / "recorded.jsonl"
    path.write_bytes(data)
    gz = tmp_path / "recorded.jsonl.gz"
    gz.write_bytes(gzip.compress(data))
    whole = decode(data, source=str(path))
    assert whole.rejects["line"].to_list() == bad_at
    for p in (path, gz):
        for chunk_bytes in (1, 4096, 1 << 20):
            parts = list(decode_jsonl_files([p], chunk_bytes=chunk_bytes, now=NOW))
            if chunk_bytes == 4096:
                assert len(parts) >= 4
            merged = Decoded.concat(parts)
            assert merged.rejects["line"].to_list() == bad_at
            assert merged.rejects["source"].unique().to_list() == [str(p)]
            assert_same_frames(merged, whole)


def test_several_files_number_lines_per_file(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(join([valid_lines()[1], b"x"]))
    b.write_bytes(join([b"y", valid_lines()[2]]))
    merged = Decoded.concat(list(decode_jsonl_files([a, b], now=NOW)))
    assert merged.rejects.select("source", "line").rows() == [(str(a), 2), (str(b), 1)]
    assert merged.frames["telemetry"]["seq"].to_list() == [1, 2]


# ----------------------------------------------------------------------------- docs


def doc_examples() -> list[bytes]:
    text = DOCS.read_text(encoding="utf-8")
    blocks = re.findall(r"```json\n(.*?)```", text, flags=re.DOTALL)
    return [orjson.dumps(orjson.loads(block)) for block in blocks]


def test_docs_examples_decode_cleanly() -> None:
    examples = doc_examples()
    decoded = decode(join(examples))
    assert decoded.rejects.is_empty(), decoded.rejects.to_dicts()
    assert decoded.rows == len(examples)
    assert all(decoded.frames[t].height >= 1 for t in RECORD_TYPES)
    events = decoded.frames["job"]["event"].to_list()
    assert {"submitted", "started", "preempted", "requeued"} <= set(events)
    fractions = decoded.frames["job"]["allocation"].explode().struct.field("fraction")
    assert (fractions < 1).any()
    first = decoded.frames["telemetry"].row(0, named=True)
    assert first["sm_active"] is not None and first["tensor_active"] is not None
    assert first["processes"][0]["job_id"] is not None


def test_docs_field_tables_match_the_contract() -> None:
    from gpuledger.contract.schema import FIELDS

    text = DOCS.read_text(encoding="utf-8")
    for record_type in RECORD_TYPES:
        for field in FIELDS[record_type]:
            assert re.search(rf"^\| `{field.name}` \|", text, flags=re.MULTILINE), (
                record_type,
                field.name,
            )


def test_reject_frame_shape_when_valid() -> None:
    decoded = decode(join(valid_lines()))
    assert decoded.rejects.schema == REJECT_SCHEMA
    assert isinstance(decoded.rejects, pl.DataFrame)
