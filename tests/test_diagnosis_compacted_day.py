"""``job_diagnosis`` of a warehouse whose ``gpu_minute`` has a compacted day.

A compacted day is one object (``gpu_minute-YYYY-MM-DD[-pNNN].<digest>.parquet``) where
the hours were (``…THH…``); the batch diagnosis read the hour from the name and failed
on a day's name. The same simulation (4 hours across midnight, 60-second samples) is
diagnosed in hourly files, with its first day compacted by the processor, and split into
two partitions whose first day ``compact_unit`` compacts: the rows must be the same.
"""

from __future__ import annotations

import shutil
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from gpuledger.pipeline.advisor.diagnosis_batch import _span, diagnose_warehouse
from gpuledger.pipeline.config import ProcessorConfig, WarehouseOptions
from gpuledger.pipeline.demo import run_demo
from gpuledger.pipeline.generations import WHOLE
from gpuledger.pipeline.simulate import SimConfig
from gpuledger.pipeline.tables import SORT_KEYS
from gpuledger.pipeline.warehouse import Warehouse, published_files, read_table

START = datetime(2026, 1, 5, 21, tzinfo=UTC)
MIDNIGHT = datetime(2026, 1, 6, tzinfo=UTC)
SIM = SimConfig(start=START, hours=4, seed=7, sample_interval_s=60)


def _gpu_minute_names(root: Path) -> list[str]:
    return sorted(k.rsplit("/", 1)[1] for k in published_files(root)
                  if k.startswith("facts/gpu_minute/"))


@pytest.fixture(scope="module")
def hourly(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("diag") / "hourly"
    run_demo(SIM, ProcessorConfig(warehouse=WarehouseOptions(compact=False)), root)
    return root


@pytest.fixture(scope="module")
def expected(hourly: Path) -> pl.DataFrame:
    return diagnose_warehouse(hourly, write=False).rows


@pytest.mark.parametrize(("name", "first", "hours"), [
    ("facts/gpu_minute/date=2026-01-05/gpu_minute-2026-01-05T22.parquet",
     datetime(2026, 1, 5, 22, tzinfo=UTC), 1),
    ("gpu_minute-2026-01-05T22.0123456789abcdef.parquet", datetime(2026, 1, 5, 22, tzinfo=UTC), 1),
    ("gpu_minute-2026-01-05T07-p003.parquet", datetime(2026, 1, 5, 7, tzinfo=UTC), 1),
    ("facts/gpu_minute/date=2026-01-05/gpu_minute-2026-01-05.parquet",
     datetime(2026, 1, 5, tzinfo=UTC), 24),
    ("gpu_minute-2026-01-05.07752dcd25862901.parquet", datetime(2026, 1, 5, tzinfo=UTC), 24),
    ("gpu_minute-2026-01-05-p003.0123456789abcdef.parquet", datetime(2026, 1, 5, tzinfo=UTC),
     24),
])
def test_span_of_hourly_and_day_names(name: str, first: datetime, hours: int) -> None:
    assert _span(name) == (first, hours)


def test_hourly_layout_has_attempts_across_midnight(hourly: Path,
                                                    expected: pl.DataFrame) -> None:
    """The data exercise what a day changes: attempts finished inside the day (by the
    hour of their end) and attempts running on past its end."""
    assert _gpu_minute_names(hourly) == [f"gpu_minute-2026-01-0{d}T{h:02d}.parquet"
                                         for d, h in [(5, 21), (5, 22), (5, 23), (6, 0)]]
    assert expected.height > 0
    assert expected.filter(pl.col("ended_at") < MIDNIGHT).height > 0
    assert expected.filter((pl.col("first_minute") < MIDNIGHT)
                           & (pl.col("last_minute") >= MIDNIGHT)).height > 0


def test_day_compacted_by_the_processor(tmp_path: Path, expected: pl.DataFrame) -> None:
    """The processor compacts the first day (as ``gpuledger demo --hours 26`` does); the
    diagnosis (written, as the demo writes it) equals that of the hourly files."""
    root = tmp_path / "compacted"
    run_demo(SIM, ProcessorConfig(warehouse=WarehouseOptions(compact_after_s=0)), root)
    assert _gpu_minute_names(root) == ["gpu_minute-2026-01-05.parquet",
                                       "gpu_minute-2026-01-06T00.parquet"]
    got = diagnose_warehouse(root)
    assert got.files > 0
    assert_frame_equal(got.rows, expected)
    written = read_table(root, "job_diagnosis").select(expected.columns)
    assert_frame_equal(written.sort(expected.columns[:3]), expected.sort(expected.columns[:3]),
                       check_row_order=False)


def test_partitions_with_a_compacted_day(tmp_path: Path, hourly: Path,
                                         expected: pl.DataFrame) -> None:
    """The hourly files moved into two partitions' files (``-p000``, ``-p001``, by node),
    the first day of each compacted by ``compact_unit``: the same diagnosis."""
    root = tmp_path / "partitioned"
    shutil.copytree(hourly, root)
    wh = Warehouse(root, options=WarehouseOptions(compact_worker=False))
    for logical in sorted(wh.publisher.unit(WHOLE).files):
        if not logical.startswith("facts/gpu_minute/"):
            continue
        frame = wh.read(logical, "")
        assert frame is not None
        hour = _span(logical)[0]
        wh.publisher.drop(WHOLE, logical)
        for p in (0, 1):
            mine = [n for n in frame["node"].unique() if zlib.crc32(n.encode()) % 2 == p]
            suffix = f"p{p:03d}"
            wh.write(wh.part_path("gpu_minute", hour, True, suffix),
                     frame.filter(pl.col("node").is_in(mine)), SORT_KEYS["gpu_minute"], suffix)
    wh.commit(wait=True)
    for unit in ("p000", "p001"):
        assert wh.compact_unit(unit, MIDNIGHT) == 1
    wh.commit(wait=True)
    wh.publish_catalog()
    wh.close()
    assert _gpu_minute_names(root) == [
        "gpu_minute-2026-01-05-p000.parquet", "gpu_minute-2026-01-05-p001.parquet",
        "gpu_minute-2026-01-06T00-p000.parquet", "gpu_minute-2026-01-06T00-p001.parquet"]
    assert_frame_equal(diagnose_warehouse(root, write=False).rows, expected)


def test_late_hour_beside_a_compacted_day(tmp_path: Path, expected: pl.DataFrame) -> None:
    """An hourly file of an hour already in the day's object is read with that hour of
    the day, not before or after it."""
    root = tmp_path / "late"
    run_demo(SIM, ProcessorConfig(warehouse=WarehouseOptions(compact_after_s=0)), root)
    wh = Warehouse(root, options=WarehouseOptions(compact_worker=False))
    day = wh.part_path("gpu_minute", MIDNIGHT - timedelta(days=1), False)
    rows = wh.read(day)
    assert rows is not None
    late_hour = datetime(2026, 1, 5, 22, tzinfo=UTC)
    in_hour = pl.col("minute").dt.truncate("1h") == late_hour
    late_nodes = pl.col("node").is_in(sorted(rows["node"].unique().to_list())[::2])
    wh.write(day, rows.filter(~(in_hour & late_nodes)))
    wh.write(wh.part_path("gpu_minute", late_hour), rows.filter(in_hour & late_nodes),
             SORT_KEYS["gpu_minute"])
    wh.commit(wait=True)
    wh.close()
    assert _gpu_minute_names(root) == ["gpu_minute-2026-01-05.parquet",
                                       "gpu_minute-2026-01-05T22.parquet",
                                       "gpu_minute-2026-01-06T00.parquet"]
    assert_frame_equal(diagnose_warehouse(root, write=False).rows, expected)
