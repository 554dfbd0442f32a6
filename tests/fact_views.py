"""Read a warehouse back through its catalog views, to compare two warehouses.

Two warehouses hold the same facts when every view gives the same rows — whatever
files they are split into (one processor, or several shards, see shard.py).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
from polars.testing import assert_frame_equal

from gpuledger.pipeline import query

# Every fact view, with the columns that identify a row.
VIEWS = {
    "gpu_minute": ["minute", "node", "gpu_index"],
    "gpu_hourly": ["hour", "pool", "card_type", "team", "queue", "job_type"],
    "gpu_daily": ["date", "pool", "card_type", "team", "queue", "job_type"],
    "frag_minute": ["minute", "pool", "card_type"],
    "pending_minute": ["minute", "queue", "pool", "card_type", "team"],
    "blocked_minute": ["minute", "job_id", "attempt"],
    "job_attempts": ["job_id", "attempt"],
    "job_gpu": ["job_id", "attempt", "node", "gpu_index"],
    "preemptions": ["time", "job_id", "attempt"],
    "recommendations": ["job_id", "attempt", "kind"],
    "running_attempts": ["job_id", "attempt"],
    "candidates": ["job_id", "attempt", "kind"],
}


def _rows(con: duckdb.DuckDBPyConnection, name: str) -> pl.DataFrame:
    frame = pl.DataFrame(pl.from_arrow(con.sql(f"SELECT * FROM {name}").to_arrow_table()))
    return frame.sort(VIEWS[name], nulls_last=True)


def view(root: str | Path, name: str) -> pl.DataFrame:
    """All rows of view ``name`` (the newest published generation: a folder or an
    ``s3://`` warehouse), in key order."""
    return views(root, [name])[name]


def views(root: str | Path, names: list[str] | None = None) -> dict[str, pl.DataFrame]:
    """The rows of every view in ``names`` (default: all of ``VIEWS``), read through one
    connection: one generation for all of them."""
    con = query.connect(root)
    try:
        return {name: _rows(con, name) for name in (names or list(VIEWS))}
    finally:
        con.close()


def assert_same_facts(got: str | Path, want: str | Path,
                      sparse: tuple[str, ...] = ()) -> None:
    """Every view equal (floats to the files' 9 decimals); views not in ``sparse`` must
    hold rows, so that an empty comparison cannot pass."""
    expected, actual = views(want), views(got)
    for name in VIEWS:
        assert expected[name].height > 0 or name in sparse, f"{name}: no rows to compare"
        # a sum of parts rounded to 9 decimals may differ in the 9th
        try:
            assert_frame_equal(actual[name], expected[name], check_exact=False,
                               rel_tol=1e-9, abs_tol=1e-8)
        except AssertionError as exc:
            raise AssertionError(f"view {name}: {exc}") from None
