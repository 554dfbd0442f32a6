"""Compaction's sort in bounded memory gives the rows, order and row groups of a sort
in memory, and the same bytes whatever its bucket size."""

from __future__ import annotations

import io
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from gpuledger.pipeline import external_sort
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


def _in_memory(parts: list[pl.DataFrame]) -> pl.DataFrame:
    rows = pl.concat(parts, how="vertical_relaxed")
    return rows.sort(KEYS, nulls_last=True, maintain_order=True)


def _rows_of(data: bytes) -> pl.DataFrame:
    return pl.read_parquet(io.BytesIO(data))


def _row_groups(data: bytes) -> list[int]:
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


PARTS = [_part(seed, rows, hour) for seed, (rows, hour)
         in enumerate([(900, 0), (0, 1), (1_200, 1), (700, 2), (1, 3)])]


@pytest.fixture(scope="module")
def whole() -> bytes:
    """The parts sorted in memory (one bucket holds them all)."""
    data, rows = sorted_parquet([parquet_bytes(p) for p in PARTS], KEYS, 500, 100_000)
    assert rows == 2_801
    assert_frame_equal(_rows_of(data), _in_memory(PARTS))
    assert _row_groups(data) == [500] * 5 + [301]
    return data


@pytest.mark.parametrize("bucket_rows", [40, 100, 499, 1_000])
def test_any_bucket_size_writes_the_bytes_of_one_sort_in_memory(bucket_rows: int,
                                                                whole: bytes) -> None:
    data, rows = sorted_parquet([parquet_bytes(p) for p in PARTS], KEYS, 500, bucket_rows)
    assert rows == 2_801
    assert data == whole


def test_parts_of_older_schemas_are_widened_as_concat_widens_them() -> None:
    """A part written with narrower types (an older writer) joins the day's supertype."""
    new = _part(1, 800, 0)
    old = _part(2, 600, 1).with_columns(pl.col("gpu_index").cast(pl.Int32),
                                        pl.col("power_w").cast(pl.Float32))
    data, rows = sorted_parquet([parquet_bytes(old), parquet_bytes(new)], KEYS, 256, 50)
    assert rows == 1_400
    assert_frame_equal(_rows_of(data), _in_memory([old, new]))
    assert pl.read_parquet(io.BytesIO(data)).schema["gpu_index"] == pl.Int64


def test_a_part_larger_than_a_bucket_is_read_in_slices() -> None:
    big = pl.concat([_part(seed, 1_000, seed % 3) for seed in range(6)])
    data, rows = sorted_parquet([parquet_bytes(big)], KEYS, 1_000, 333)
    assert rows == 6_000
    assert_frame_equal(_rows_of(data), _in_memory([big]))
    assert _row_groups(data) == [1_000] * 6


def test_no_rows_give_an_empty_object_of_the_schema() -> None:
    empty = _part(1, 0, 0)
    data, rows = sorted_parquet([parquet_bytes(empty)], KEYS, 100, 10)
    assert rows == 0
    assert pl.read_parquet(io.BytesIO(data)).schema == empty.schema


def test_parts_on_disk_give_the_bytes_of_parts_in_memory(tmp_path: Path, whole: bytes) -> None:
    """Compaction fetches the day's objects to files rather than holding them."""
    files = []
    for i, part in enumerate(PARTS):
        files.append(tmp_path / f"{i}.parquet")
        files[-1].write_bytes(parquet_bytes(part))
    data, rows = sorted_parquet(files, KEYS, 500, 100)
    assert (rows, data) == (2_801, whole)


def test_nulls_in_the_second_leading_key_sort_last_in_every_bucket_size() -> None:
    """Buckets are cut on the first two keys; a null in the second sorts after its
    values, in the bucket of the values it follows."""
    keys = ["node", "job_id", "minute", "gpu_index"]
    want = pl.concat(PARTS).sort(keys, nulls_last=True, maintain_order=True)
    for bucket_rows in (40, 333):
        data, rows = sorted_parquet([parquet_bytes(p) for p in PARTS], keys, 500, bucket_rows)
        assert rows == 2_801
        assert_frame_equal(_rows_of(data), want)


def test_a_large_input_gets_larger_buckets_not_more_files(
        monkeypatch: pytest.MonkeyPatch, whole: bytes) -> None:
    """The buckets' files are open while the parts are spilled: past ``MAX_BUCKETS``
    the buckets grow instead; the object is the same."""
    monkeypatch.setattr(external_sort, "MAX_BUCKETS", 3)
    opened: list[int] = []
    real = external_sort._Spill.add

    def add(self: external_sort._Spill, rows: pl.DataFrame) -> None:
        real(self, rows)
        opened.append(len(self.files))

    monkeypatch.setattr(external_sort._Spill, "add", add)
    data, rows = sorted_parquet([parquet_bytes(p) for p in PARTS], KEYS, 500, 40)
    assert (rows, data) == (2_801, whole)
    assert 1 < max(opened) <= 4  # about 3 buckets of ~934 rows (a bucket may run over)


def test_sampled_bounds_cut_buckets_of_about_the_asked_size(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The bounds come from a sample of the leading keys (every 16th row here): the
    buckets still hold about ``bucket_rows`` rows each, and the object is a sort in
    memory."""
    rng = random.Random(7)
    rows = 40_000
    big = pl.DataFrame({
        "minute": [T0 + timedelta(minutes=rng.randrange(1_440)) for _ in range(rows)],
        "node": [f"n{rng.randrange(50)}" for _ in range(rows)],
        "gpu_index": [rng.randrange(8) for _ in range(rows)],
        "job_id": [rng.choice([None, None, *[f"j{k}" for k in range(40)]])
                   for _ in range(rows)],
    }, schema_overrides={"minute": pl.Datetime("ms", "UTC")})
    heights: list[int] = []
    real = external_sort._Spill.buckets

    def buckets(self: external_sort._Spill) -> Iterator[pl.DataFrame]:
        for bucket in real(self):
            heights.append(bucket.height)
            yield bucket

    monkeypatch.setattr(external_sort._Spill, "buckets", buckets)
    parts = [parquet_bytes(big.slice(i, 10_000)) for i in range(0, rows, 10_000)]
    data, count = sorted_parquet(parts, KEYS, 8_192, 4_096)
    assert count == rows
    assert_frame_equal(_rows_of(data), _in_memory([big]))
    assert sum(heights) == rows
    assert 9 <= len(heights) <= 11
    assert max(heights) <= 1.25 * 4_096, heights
