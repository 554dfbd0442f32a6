"""Minute arithmetic shared by every fact: which minutes an interval touches, and how much.

Two rules, each used where it fits (docs/metrics.md, *Time grain*):

- **Held time is exact to the second** (:func:`expand_held`). An interval ``[start, end)``
  (an allocation) adds to each minute ``m`` the seconds it overlaps ``[m, m + 60 s)``. A job
  that holds a GPU from 10:00:20 to 10:00:50 holds 30 s of minute 10:00: half a
  GPU-minute. Allocation, use, idle and waste are built from these seconds, so they add
  up to the intervals' lengths exactly.
- **Snapshots are taken at the minute's middle** (:func:`expand_to_minutes`). A state that
  is a count at an instant (pending jobs, free GPUs for fragmentation) is read at
  ``m + 30 s``: an interval covers minute ``m`` when ``m + 30 s`` lies inside it. Every
  minute then belongs to exactly one side of any boundary.

Internally times are integer milliseconds since the epoch (``*_ms`` columns); frames
handed to the warehouse carry ``minute`` as a UTC datetime.
"""

from __future__ import annotations

from datetime import datetime

import polars as pl

from gpuledger.pipeline.columns import TIME_DTYPE

MINUTE_MS = 60_000
HALF_MINUTE_MS = 30_000
HOUR_MS = 3_600_000


def ms(t: datetime) -> int:
    """``t`` as integer milliseconds since the epoch."""
    return int(t.timestamp() * 1000)


def floor_minute_ms(expr: pl.Expr) -> pl.Expr:
    return (expr // MINUTE_MS) * MINUTE_MS


def ceil_minute_ms(expr: pl.Expr) -> pl.Expr:
    return ((expr + (MINUTE_MS - 1)) // MINUTE_MS) * MINUTE_MS


def to_time(expr: pl.Expr) -> pl.Expr:
    """Integer milliseconds back to the contract's UTC datetime."""
    return expr.cast(pl.Datetime("ms")).dt.replace_time_zone("UTC")


def expand_to_minutes(
    intervals: pl.DataFrame,
    start: str,
    end: str,
    range_start: datetime,
    range_end: datetime,
) -> pl.DataFrame:
    """One row per (interval, minute whose middle it covers) in ``[range_start, range_end)``.

    ``end`` may be null (still open). Adds a ``minute`` column (UTC, ms).
    """
    lo, hi = ms(range_start), ms(range_end)
    start_ms = pl.col(start).cast(pl.Int64)
    end_ms = pl.col(end).cast(pl.Int64).fill_null(hi + MINUTE_MS)
    first = pl.max_horizontal(ceil_minute_ms(start_ms - HALF_MINUTE_MS), pl.lit(lo))
    stop = pl.min_horizontal(ceil_minute_ms(end_ms - HALF_MINUTE_MS), pl.lit(hi))
    return (
        intervals.with_columns(first.alias("_first"), stop.alias("_stop"))
        .filter(pl.col("_first") < pl.col("_stop"))
        .with_columns(
            pl.int_ranges(pl.col("_first"), pl.col("_stop"), MINUTE_MS).alias("minute")
        )
        .explode("minute")
        .with_columns(to_time(pl.col("minute")).alias("minute"))
        .drop("_first", "_stop")
    )


def clip_ms(frame: pl.DataFrame | pl.LazyFrame, start: str, end: str, lo: pl.Expr | int,
            hi: int) -> pl.LazyFrame:
    """Add ``s_ms``/``e_ms``: ``[start, end)`` clipped to ``[lo, hi)`` (null end = open),
    keeping the rows that still hold time. ``lo`` may be an expression (a lower bound per
    row, e.g. per partition)."""
    lo_expr = lo if isinstance(lo, pl.Expr) else pl.lit(lo)
    return (
        frame.lazy()
        .with_columns(
            pl.max_horizontal(pl.col(start).cast(pl.Int64), lo_expr).alias("s_ms"),
            pl.min_horizontal(pl.col(end).cast(pl.Int64).fill_null(hi), pl.lit(hi)).alias("e_ms"),
        )
        .filter(pl.col("s_ms") < pl.col("e_ms"))
    )


def expand_held(clipped: pl.LazyFrame) -> pl.LazyFrame:
    """One row per (piece, minute it overlaps) from ``s_ms``/``e_ms`` (see :func:`clip_ms`):
    adds ``minute_ms`` and ``held_ms``, the milliseconds of the minute the piece holds."""
    return (
        clipped.with_columns(
            pl.int_ranges(floor_minute_ms(pl.col("s_ms")), ceil_minute_ms(pl.col("e_ms")),
                          MINUTE_MS).alias("minute_ms"))
        .explode("minute_ms")
        .with_columns(
            (pl.min_horizontal(pl.col("e_ms"), pl.col("minute_ms") + MINUTE_MS)
             - pl.max_horizontal(pl.col("s_ms"), pl.col("minute_ms"))).alias("held_ms"))
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
