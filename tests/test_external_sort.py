"""Compaction's sort in bounded memory gives the very object a sort in memory gives."""

from __future__ import annotations

import io
import random
from datetime import UTC, datetime, timedelta

import polars as pl
import pyarrow.parquet as pq
import pytest

from gpuledger.pipeline.external_sort import sorted_parquet
from gpuledger.pipeline.warehouse import parquet_bytes

KEYS = ["job_id", "minute", "node", "gpu_index"]
T0 = datetime(2026, 1, 5, tzinfo=UTC)


def _part(seed: int, rows: int, hour: int) -> pl.DataFrame:
    """An hour's rows: many idle (null job) GPU-minutes, jobs over several hours, and
    rows whose whole key repeats (ties keep the parts' order)."""
    rng = random.Random(seed)
    jobs = [None, None, None, "j1", "j2", "j10", "job-7", "z"]
    return pl.DataFrame({
        "minute": [T0 + timedelta(hours=hour, minutes=rng.randrange(60)) for _ in range(rows)],
        "node": [f"n{rng.randrange(5)}" for _ in range(rows)],
        "gpu_index": [rng.randrange(4) for _ in range(rows)],
        "job_id": [rng.choice(jobs) for _ in range(rows)],
        "power_w": [rng.random() * 300 for _ in range(rows)],
        "seq": [seed * 1_000_000 + i for i in range(rows)],
    }, schema_overrides={"minute": pl.Datetime("ms", "UTC")})


def _in_memory(parts: list[pl.DataFrame], row_group_size: int) -> bytes:
    rows = pl.concat(parts, how="vertical_relaxed")
    return parquet_bytes(rows.sort(KEYS, nulls_last=True, maintain_order=True), row_group_size)


@pytest.mark.parametrize("bucket_rows", [40, 100, 1_000, 100_000])
def test_any_bucket_size_writes_the_bytes_of_a_sort_in_memory(bucket_rows: int) -> None:
    parts = [_part(seed, rows, hour) for seed, (rows, hour)
             in enumerate([(900, 0), (0, 1), (1_200, 1), (700, 2), (1, 3)])]
    data, rows = sorted_parquet([parquet_bytes(p) for p in parts], KEYS, 500, bucket_rows)
    assert rows == sum(p.height for p in parts)
    assert data == _in_memory(parts, 500)
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == \
        [500] * (rows // 500) + ([rows % 500] if rows % 500 else [])


def test_parts_of_older_schemas_are_widened_as_concat_widens_them() -> None:
    """A part written with narrower types (an older writer) joins the day's supertype."""
    new = _part(1, 800, 0)
    old = _part(2, 600, 1).with_columns(pl.col("gpu_index").cast(pl.Int32),
                                        pl.col("power_w").cast(pl.Float32))
    data, rows = sorted_parquet([parquet_bytes(old), parquet_bytes(new)], KEYS, 256, 50)
    assert rows == 1_400
    assert data == _in_memory([old, new], 256)
    assert pl.read_parquet(io.BytesIO(data)).schema["gpu_index"] == pl.Int64


def test_a_part_larger_than_a_bucket_is_read_in_slices() -> None:
    big = pl.concat([_part(seed, 1_000, seed % 3) for seed in range(6)])
    data, rows = sorted_parquet([parquet_bytes(big)], KEYS, 1_000, 333)
    assert rows == 6_000
    assert data == _in_memory([big], 1_000)


def test_no_rows_give_an_empty_object_of_the_schema() -> None:
    empty = _part(1, 0, 0)
    data, rows = sorted_parquet([parquet_bytes(empty)], KEYS, 100, 10)
    assert rows == 0
    assert pl.read_parquet(io.BytesIO(data)).schema == empty.schema
