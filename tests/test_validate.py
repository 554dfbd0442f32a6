"""Tests for gpuledger.pipeline.validate: columnar checks of contract frames."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl
import pytest

from gpuledger.contract.schema import RECORD_TYPES, RecordType
from gpuledger.pipeline.columns import conform, schema_of
from gpuledger.pipeline.config import Limits
from gpuledger.pipeline.validate import (
    REJECT_SCHEMA,
    check,
    parse_rfc3339,
    validate,
)

NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
T = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)


def frame(record_type: RecordType, rows: list[dict[str, Any]]) -> pl.DataFrame:
    """Rows (dicts with contract values) as a contract frame."""
    return conform(pl.DataFrame(rows, schema=schema_of(record_type), orient="row"), record_type)


def tel(**extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "v": 1,
        "type": "telemetry",
        "time": T,
        "node": "n1",
        "seq": 1,
        "gpu_index": 0,
        "gpu_uuid": "GPU-0",
        "card_type": "H100-SXM5-80GB",
        "util_gpu": 50.0,
        "sm_active": 0.5,
        "mem_used_mib": 1000.0,
        "processes": [{"pid": 10, "used_mib": 900.0, "job_id": "j1"}],
    }
    row.update(extra)
    return row


def inv(**extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "v": 1,
        "type": "inventory",
        "time": T,
        "node": "n1",
        "pool": "train",
        "card_type": "H100-SXM5-80GB",
        "gpu_count": 8,
        "gpu_mem_mib": 81559.0,
        "labels": '{"rack":"r1"}',
        "schedulable": True,
        "health": "ok",
        "unhealthy_gpus": [1],
    }
    row.update(extra)
    return row


def jb(event: str = "started", **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"v": 1, "type": "job", "time": T, "event": event, "job_id": "j1"}
    if event == "started":
        row["allocation"] = [{"node": "n1", "gpu_index": 0, "gpu_uuid": "G", "fraction": 0.5}]
    row.update(extra)
    return row


def reasons(record_type: RecordType, *rows: dict[str, Any], **kwargs: Any) -> list[str]:
    _, rejects = validate(frame(record_type, list(rows)), record_type, now=NOW, **kwargs)
    return list(rejects["reason"])


def one_reason(record_type: RecordType, row: dict[str, Any], **kwargs: Any) -> str:
    got = reasons(record_type, row, **kwargs)
    assert len(got) == 1, got
    return got[0]


def test_valid_frames_pass_unchanged() -> None:
    for record_type, row in (("telemetry", tel()), ("inventory", inv()), ("job", jb())):
        f = frame(record_type, [row, row])  # type: ignore[arg-type]
        valid, rejects = validate(f, record_type, now=NOW)  # type: ignore[arg-type]
        assert valid.equals(f)
        assert valid.schema == schema_of(record_type)  # type: ignore[arg-type]
        assert rejects.schema == REJECT_SCHEMA and rejects.is_empty()


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (tel(util_gpu=140.0), "field 'util_gpu': 140.0 is above the maximum 100"),
        (tel(util_gpu=-0.5), "field 'util_gpu': -0.5 is below the minimum 0"),
        (tel(sm_active=1.5), "field 'sm_active': 1.5 is above the maximum 1"),
        (tel(temp_c=250.0), "field 'temp_c': 250.0 is above the maximum 200"),
        (tel(gpu_index=1024), "field 'gpu_index': 1024 is above the maximum 1023"),
        (tel(ecc_dbe=-1), "field 'ecc_dbe': -1 is below the minimum 0"),
        (tel(mem_used_mib=float("nan")), "field 'mem_used_mib': NaN is not a number"),
        (tel(power_w=float("inf")), "field 'power_w': inf is not finite"),
        (tel(temp_c=float("-inf")), "field 'temp_c': -inf is not finite"),
        (tel(node=None), "field 'node': required but missing"),
        (tel(node=""), "field 'node': required but empty"),
        (tel(v=2), "field 'v': unsupported contract version 2 (this processor reads v=1)"),
        (tel(v=None), "field 'v': required but missing"),
        (tel(type="job"), "field 'type': 'job' does not match the record type 'telemetry'"),
        (
            tel(time=datetime(2031, 1, 1, tzinfo=UTC)),
            "field 'time': 2031-01-01T00:00:00Z is more than 3600 s in the future",
        ),
        (
            tel(time=datetime(1999, 12, 31, 23, 59, 59, 250000, tzinfo=UTC)),
            "field 'time': 1999-12-31T23:59:59.250Z is before 2000-01-01T00:00:00Z",
        ),
        (tel(time=None), "field 'time': required but missing"),
        (
            tel(processes=[{"pid": -1, "used_mib": 1.0, "job_id": None}]),
            "field 'processes': pid -1 is negative",
        ),
        (
            tel(processes=[{"pid": 1, "used_mib": float("nan"), "job_id": None}]),
            "field 'processes': used_mib NaN is not a number",
        ),
        (
            tel(processes=[{"pid": 1, "used_mib": float("inf"), "job_id": None}]),
            "field 'processes': used_mib inf is not finite",
        ),
        (
            tel(processes=[{"pid": 1, "used_mib": 2.0, "job_id": None}, None]),
            "field 'processes': an entry is null",
        ),
        (
            tel(processes=[{"pid": None, "used_mib": 2.0, "job_id": None}]),
            "field 'processes': an entry has no pid",
        ),
        (
            tel(processes=[{"pid": 1, "used_mib": -2.0, "job_id": None}]),
            "field 'processes': used_mib -2.0 is negative",
        ),
    ],
)
def test_telemetry_rules(row: dict[str, Any], reason: str) -> None:
    assert one_reason("telemetry", row) == reason


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (
            jb("exploded"),
            "field 'event': 'exploded' is not one of submitted, started, checkpointed, "
            "preempted, requeued, finished, failed, cancelled",
        ),
        (jb(job_id=None), "field 'job_id': required but missing"),
        (jb(gpus=-2), "field 'gpus': -2 is below the minimum 0"),
        (
            jb("started", allocation=None),
            "field 'allocation': a 'started' event needs a non-empty allocation",
        ),
        (
            jb("started", allocation=[]),
            "field 'allocation': a 'started' event needs a non-empty allocation",
        ),
        (
            jb(allocation=[{"node": "n", "gpu_index": 0, "gpu_uuid": None, "fraction": 1.01}]),
            "field 'allocation': fraction 1.01 is not in (0, 1]",
        ),
        (
            jb(allocation=[{"node": "n", "gpu_index": 0, "gpu_uuid": None, "fraction": -0.5}]),
            "field 'allocation': fraction -0.5 is not in (0, 1]",
        ),
        (
            jb(allocation=[{"node": "n", "gpu_index": 0, "gpu_uuid": None, "fraction": 0.0}]),
            "field 'allocation': fraction 0.0 is not in (0, 1]",
        ),
        (
            jb(
                allocation=[
                    {"node": "n", "gpu_index": 0, "gpu_uuid": None, "fraction": float("nan")}
                ]
            ),
            "field 'allocation': fraction NaN is not a number",
        ),
        (
            jb(allocation=[{"node": None, "gpu_index": 0, "gpu_uuid": None, "fraction": 1.0}]),
            "field 'allocation': an entry has no node",
        ),
        (
            jb(allocation=[{"node": "", "gpu_index": 0, "gpu_uuid": None, "fraction": 1.0}]),
            "field 'allocation': an entry has no node",
        ),
        (
            jb(allocation=[{"node": "n", "gpu_index": None, "gpu_uuid": None, "fraction": 1.0}]),
            "field 'allocation': an entry has no gpu_index",
        ),
        (
            jb(allocation=[{"node": "n", "gpu_index": -4, "gpu_uuid": None, "fraction": 1.0}]),
            "field 'allocation': gpu_index -4 is negative",
        ),
        (
            jb("submitted", job_type="batch"),
            "field 'job_type': 'batch' is not one of training, fine-tune, evaluation, "
            "inference, interactive",
        ),
    ],
)
def test_job_rules(row: dict[str, Any], reason: str) -> None:
    assert one_reason("job", row) == reason


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (inv(health="sick"), "field 'health': 'sick' is not one of ok, degraded, down"),
        (inv(schedulable=None), "field 'schedulable': required but missing"),
        (inv(gpu_count=2000), "field 'gpu_count': 2000 is above the maximum 1024"),
        (inv(unhealthy_gpus=[8]), "field 'unhealthy_gpus': 8 is not below gpu_count 8"),
        (inv(unhealthy_gpus=[-1]), "field 'unhealthy_gpus': -1 is negative"),
        (inv(unhealthy_gpus=[None]), "field 'unhealthy_gpus': an entry is null"),
        (inv(labels="rack=r1"), "field 'labels': 'rack=r1' is not a JSON object of strings"),
        (inv(labels='{"n": 1}'), "field 'labels': '{\"n\": 1}' is not a JSON object of strings"),
        (inv(labels="[]"), "field 'labels': '[]' is not a JSON object of strings"),
    ],
)
def test_inventory_rules(row: dict[str, Any], reason: str) -> None:
    assert one_reason("inventory", row) == reason


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (tel(power_w=1e308),
         "field 'power_w': 1e+308 is above the physical limit 2000 W (limits.power_max_w)"),
        (tel(power_w=2000.5),
         "field 'power_w': 2000.5 is above the physical limit 2000 W (limits.power_max_w)"),
        (tel(temp_c=151.0),
         "field 'temp_c': 151.0 is above the physical limit 150 °C (limits.temp_max_c)"),
        (tel(temp_c=-41.0),
         "field 'temp_c': -41.0 is below the physical limit -40 °C (limits.temp_min_c)"),
        (tel(sm_clock_mhz=6000.0), "field 'sm_clock_mhz': 6000.0 is above the physical "
                                   "limit 5000 MHz (limits.clock_max_mhz)"),
        (tel(mem_used_mib=1e7, processes=None), "field 'mem_used_mib': 10000000.0 is above "
                                                "the physical limit 1048576 MiB "
                                                "(limits.memory_max_mib)"),
        (tel(mem_total_mib=2e6), "field 'mem_total_mib': 2000000.0 is above the physical "
                                 "limit 1048576 MiB (limits.memory_max_mib)"),
        (tel(mem_used_mib=86000.0, mem_total_mib=81559.0, processes=None),
         "field 'mem_used_mib': 86000.0 is more than mem_total_mib 81559.0 (+5 %, "
         "limits.memory_margin)"),
        (tel(mem_total_mib=40000.0, processes=[
            {"pid": 1, "used_mib": 30000.0, "job_id": None},
            {"pid": 2, "used_mib": 20000.0, "job_id": None}]),
         "field 'processes': used_mib adds up to 50000.0, more than mem_total_mib 40000.0 "
         "(+5 %, limits.memory_margin)"),
        (tel(processes=[{"pid": 1, "used_mib": 2e6, "job_id": None}]),
         "field 'processes': used_mib 2000000.0 is above the physical limit 1048576 MiB "
         "(limits.memory_max_mib)"),
        (tel(pcie_rx_bytes_s=2e13), "field 'pcie_rx_bytes_s': 20000000000000.0 is above the "
                                    "physical limit 10000000000000 bytes/s "
                                    "(limits.byte_rate_max)"),
        (tel(nvlink_tx_bytes_s=1e300), "field 'nvlink_tx_bytes_s': 1e+300 is above the "
                                       "physical limit 10000000000000 bytes/s "
                                       "(limits.byte_rate_max)"),
        # out of the contract's range: only the contract's reason
        (tel(temp_c=250.0), "field 'temp_c': 250.0 is above the maximum 200"),
    ],
)
def test_physical_limits(row: dict[str, Any], reason: str) -> None:
    assert one_reason("telemetry", row) == reason


def test_physical_limits_on_inventory_and_job_memory() -> None:
    assert one_reason("inventory", inv(gpu_mem_mib=1e9)) == (
        "field 'gpu_mem_mib': 1000000000.0 is above the physical limit 1048576 MiB "
        "(limits.memory_max_mib)")
    assert one_reason("job", jb("submitted", gpu_mem_mib=1e308)) == (
        "field 'gpu_mem_mib': 1e+308 is above the physical limit 1048576 MiB "
        "(limits.memory_max_mib)")


def test_limits_at_their_bounds_pass_and_are_configurable() -> None:
    edge = tel(power_w=2000.0, temp_c=150.0, sm_clock_mhz=5000.0, mem_total_mib=80000.0,
               mem_used_mib=84000.0, pcie_tx_bytes_s=1e13,
               processes=[{"pid": 1, "used_mib": 84000.0, "job_id": None}])
    assert reasons("telemetry", edge) == []
    hot = tel(power_w=2500.0, temp_c=-45.0)
    assert len(reasons("telemetry", hot)) == 1
    site = Limits(power_max_w=3000.0, temp_min_c=-50.0)
    assert reasons("telemetry", hot, limits=site) == []
    tight = Limits(memory_margin=0.0)
    assert reasons("telemetry", edge, limits=tight) == [
        "field 'mem_used_mib': 84000.0 is more than mem_total_mib 80000.0 (+0 %, "
        "limits.memory_margin); field 'processes': used_mib adds up to 84000.0, more than "
        "mem_total_mib 80000.0 (+0 %, limits.memory_margin)"]


def test_limits_on_a_large_frame_take_the_screened_path() -> None:
    rows = [tel(seq=i, power_w=300.0, mem_total_mib=81559.0) for i in range(5000)]
    rows[4321] = tel(seq=4321, power_w=1e308)
    rows[17] = tel(seq=17, mem_total_mib=1000.0, mem_used_mib=900.0, processes=[
        {"pid": 1, "used_mib": 800.0, "job_id": None},
        {"pid": 2, "used_mib": 800.0, "job_id": None}])
    valid, rejects = validate(frame("telemetry", rows), "telemetry", now=NOW)
    assert valid.height == 4998
    assert rejects["reason"].to_list() == [
        "field 'processes': used_mib adds up to 1600.0, more than mem_total_mib 1000.0 "
        "(+5 %, limits.memory_margin)",
        "field 'power_w': 1e+308 is above the physical limit 2000 W (limits.power_max_w)"]


def test_several_problems_in_one_reason_in_field_order() -> None:
    row = tel(v=3, node=None, util_gpu=101.0, temp_c=float("nan"), seq=-1)
    assert one_reason("telemetry", row) == (
        "field 'v': unsupported contract version 3 (this processor reads v=1); "
        "field 'node': required but missing; "
        "field 'seq': -1 is below the minimum 0; "
        "field 'util_gpu': 101.0 is above the maximum 100; "
        "field 'temp_c': NaN is not a number"
    )


def test_valid_rows_keep_order_and_rejects_carry_lines_and_source() -> None:
    rows = [tel(seq=i, util_gpu=200.0 if i in (1, 4) else 10.0) for i in range(6)]
    f = frame("telemetry", rows)
    lines = pl.Series("line", [10, 11, 12, 13, 14, 15])
    raw = pl.Series("raw", [f"line {i}" for i in range(6)])
    valid, rejects = validate(
        f, "telemetry", now=NOW, source="kafka:gpu.telemetry.v1/3", line=lines, raw=raw
    )
    assert valid["seq"].to_list() == [0, 2, 3, 5]
    assert rejects.to_dicts() == [
        {
            "record_type": "telemetry",
            "source": "kafka:gpu.telemetry.v1/3",
            "line": line,
            "reason": "field 'util_gpu': 200.0 is above the maximum 100",
            "raw": f"line {i}",
        }
        for i, line in ((1, 11), (4, 14))
    ]


def test_raw_defaults_to_a_json_rendering_and_line_to_null() -> None:
    _, rejects = validate(frame("job", [jb("started", allocation=[])]), "job", now=NOW)
    assert rejects["line"].to_list() == [None]
    assert rejects["raw"][0].startswith('{"v":1,"type":"job","time":"2026-01-05T10:00:00.000Z"')
    assert '"allocation":[]' in rejects["raw"][0]


def test_allocation_fraction_null_means_whole_gpu() -> None:
    row = jb(allocation=[{"node": "n", "gpu_index": 3, "gpu_uuid": None, "fraction": None}])
    valid, rejects = validate(frame("job", [row]), "job", now=NOW)
    assert rejects.is_empty()
    assert valid["allocation"][0].to_list() == [
        {"node": "n", "gpu_index": 3, "gpu_uuid": None, "fraction": 1.0}
    ]


def test_missing_columns_count_as_null() -> None:
    f = pl.DataFrame({"v": [1], "type": ["job"], "time": [T], "event": ["submitted"]})
    valid, rejects = validate(f, "job", now=NOW)
    assert valid.is_empty()
    assert rejects["reason"].to_list() == ["field 'job_id': required but missing"]
    ok = f.with_columns(job_id=pl.lit("j"))
    valid, rejects = validate(ok, "job", now=NOW)
    assert rejects.is_empty() and valid.schema == schema_of("job")


def test_compatible_dtypes_are_read_and_lossy_values_rejected() -> None:
    f = pl.DataFrame(
        {
            "v": pl.Series([1, 1, 1], dtype=pl.Int8),
            "type": ["telemetry"] * 3,
            "time": pl.Series([datetime(2026, 1, 5, 10)] * 3, dtype=pl.Datetime("us")),
            "node": ["a", "b", "c"],
            "seq": [1.0, 2.5, 3.0],  # floats for an integer field
            "gpu_index": pl.Series([0, 1, 2], dtype=pl.UInt8),
            "gpu_uuid": pl.Series(["G0", "G1", "G2"], dtype=pl.Categorical),
            "card_type": ["H100"] * 3,
            "util_gpu": pl.Series([1, 2, 3], dtype=pl.Int32),
        }
    )
    valid, rejects = validate(f, "telemetry", now=NOW)
    assert valid["seq"].to_list() == [1, 3]
    assert valid["time"].to_list() == [datetime(2026, 1, 5, 10, tzinfo=UTC)] * 2
    assert valid["util_gpu"].to_list() == [1.0, 3.0]
    assert valid.schema == schema_of("telemetry")
    assert rejects["reason"].to_list() == ["field 'seq': 2.5 cannot be read as an integer"]


def test_a_column_of_the_wrong_kind_rejects_its_rows() -> None:
    f = frame("telemetry", [tel(), tel(util_gpu=None)]).with_columns(
        util_gpu=pl.Series(["high", None])
    )
    valid, rejects = validate(f, "telemetry", now=NOW)
    assert valid.height == 1
    assert rejects["reason"].to_list() == [
        "field 'util_gpu': a column of String cannot be read as a number"
    ]


def test_time_as_text_is_parsed() -> None:
    times = [
        "2026-01-05T10:00:00Z",
        "2026-01-05T11:00:00.5+01:00",
        "2026-01-05T10:00:00",
        "05/01/2026 10:00",
        "2026-01-05T10:00:60Z",
    ]
    f = frame("telemetry", [tel()] * 5).with_columns(time=pl.Series(times))
    valid, rejects = validate(f, "telemetry", now=NOW)
    assert valid["time"].to_list() == [T, T + timedelta(milliseconds=500)]
    assert rejects["reason"].to_list() == [
        f"field 'time': '{t}' is not an RFC 3339 time" for t in times[2:]
    ]


def test_now_defaults_to_the_wall_clock() -> None:
    soon = datetime.now(UTC) + timedelta(minutes=10)
    later = datetime.now(UTC) + timedelta(hours=3)
    f = frame("telemetry", [tel(time=soon), tel(time=later)])
    valid, rejects = validate(f, "telemetry")
    assert valid.height == 1 and rejects.height == 1
    assert rejects["reason"][0].endswith("is more than 3600 s in the future")


def test_min_time_is_configurable() -> None:
    f = frame("telemetry", [tel()])
    _, rejects = validate(f, "telemetry", now=NOW, min_time=datetime(2026, 6, 1, tzinfo=UTC))
    assert rejects["reason"].to_list() == [
        "field 'time': 2026-01-05T10:00:00Z is before 2026-06-01T00:00:00Z"
    ]


def test_empty_frame() -> None:
    for record_type in RECORD_TYPES:
        valid, rejects = validate(pl.DataFrame(), record_type, now=NOW)
        assert valid.is_empty() and valid.schema == schema_of(record_type)
        assert rejects.is_empty() and rejects.schema == REJECT_SCHEMA


def test_line_series_must_match_the_frame() -> None:
    with pytest.raises(ValueError, match="line has 1 values for 2 rows"):
        validate(frame("job", [jb(), jb()]), "job", now=NOW, line=pl.Series([1]))


def test_check_reports_positions() -> None:
    f = frame("job", [jb(), jb("exploded"), jb(), jb(gpus=-1)])
    result = check(f, "job", now=NOW)
    assert result.rejected_index.to_list() == [1, 3]
    assert result.valid.height == 2


def test_parse_rfc3339_arrow_and_polars_paths_agree() -> None:
    rng = random.Random(11)
    texts = []
    for _ in range(500):
        base = datetime(2000, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randrange(0, 10**9))
        text = base.strftime("%Y-%m-%dT%H:%M:%S")
        digits = rng.choice([0, 1, 3, 6, 9])
        if digits:
            text += "." + "".join(rng.choice("0123456789") for _ in range(digits))
        offset = rng.choice(["Z", "+00:00", "+05:30", "-08:00", "+14:00"])
        texts.append(text + offset)
    fast = parse_rfc3339(pl.Series(texts))
    # An impossible date makes Arrow refuse the column, so Polars parses all of it.
    slow = parse_rfc3339(pl.Series([*texts, "2026-02-30T00:00:00Z"]))
    assert slow[-1] is None
    assert fast.equals(slow[:-1])
    assert fast.null_count() == 0
