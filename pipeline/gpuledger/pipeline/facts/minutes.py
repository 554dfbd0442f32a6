"""Minute arithmetic shared by every fact: which minutes an interval covers.

An interval ``[start, end)`` (allocation, pending time) covers minute ``m`` when the
minute's middle ``m + 30 s`` lies inside it. A job that holds a GPU from 10:00:20 to
10:02:40 therefore covers the minutes 10:00, 10:01 and 10:02 (middles 10:00:30,
10:01:30 and 10:02:30); one that holds it from 10:00:40 to 10:01:20 covers none.
Every minute is attributed to exactly one side of any boundary, so totals add up.
"""

from __future__ import annotations

from datetime import datetime

import polars as pl

from gpuledger.pipeline.columns import TIME_DTYPE

MINUTE_MS = 60_000
HALF_MINUTE_MS = 30_000


def _ceil_minute_ms(expr: pl.Expr) -> pl.Expr:
    return ((expr + (MINUTE_MS - 1)) // MINUTE_MS) * MINUTE_MS


def expand_to_minutes(
    intervals: pl.DataFrame,
    start: str,
    end: str,
    range_start: datetime,
    range_end: datetime,
) -> pl.DataFrame:
    """One row per (interval, covered minute) inside ``[range_start, range_end)``.

    ``end`` may be null (still open). Adds a ``minute`` column (UTC, ms).
    """
    lo = int(range_start.timestamp() * 1000)
    hi = int(range_end.timestamp() * 1000)
    start_ms = pl.col(start).cast(pl.Int64)
    end_ms = pl.col(end).cast(pl.Int64).fill_null(hi + MINUTE_MS)
    first = pl.max_horizontal(_ceil_minute_ms(start_ms - HALF_MINUTE_MS), pl.lit(lo))
    stop = pl.min_horizontal(_ceil_minute_ms(end_ms - HALF_MINUTE_MS), pl.lit(hi))
    return (
        intervals.with_columns(first.alias("_first"), stop.alias("_stop"))
        .filter(pl.col("_first") < pl.col("_stop"))
        .with_columns(
            pl.int_ranges(pl.col("_first"), pl.col("_stop"), MINUTE_MS).alias("minute")
        )
        .explode("minute")
        .with_columns(pl.col("minute").cast(pl.Datetime("ms")).dt.replace_time_zone("UTC"))
        .drop("_first", "_stop")
    )


def minute_of(expr: pl.Expr) -> pl.Expr:
    """The minute (UTC, ms) an event time falls in."""
    return expr.dt.truncate("1m").cast(TIME_DTYPE)


def minute_range(range_start: datetime, range_end: datetime) -> pl.Series:
    """All minutes in ``[range_start, range_end)``."""
    return pl.datetime_range(
        range_start, range_end, "1m", closed="left", time_unit="ms", time_zone="UTC",
        eager=True,
    ).alias("minute")
