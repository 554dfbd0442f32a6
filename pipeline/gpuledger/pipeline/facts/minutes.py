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

from gpuledger.pipeline import engines
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


def middle_span(intervals: pl.DataFrame | pl.LazyFrame, start: str, end: str,
                range_start: datetime, range_end: datetime) -> pl.LazyFrame:
    """Add ``_first``/``_stop`` (ms): the minutes ``[_first, _stop)`` of
    ``[range_start, range_end)`` whose middle ``[start, end)`` covers (``end`` null: still
    open), keeping the intervals that cover at least one."""
    lo, hi = ms(range_start), ms(range_end)
    start_ms = pl.col(start).cast(pl.Int64)
    end_ms = pl.col(end).cast(pl.Int64).fill_null(hi + MINUTE_MS)
    return intervals.lazy().with_columns(
        pl.max_horizontal(ceil_minute_ms(start_ms - HALF_MINUTE_MS), pl.lit(lo)).alias("_first"),
        pl.min_horizontal(ceil_minute_ms(end_ms - HALF_MINUTE_MS), pl.lit(hi)).alias("_stop"),
    ).filter(pl.col("_first") < pl.col("_stop"))


def expand_to_minutes(
    intervals: pl.DataFrame,
    start: str,
    end: str,
    range_start: datetime,
    range_end: datetime,
    every: int = 1,
) -> pl.DataFrame:
    """One row per (interval, minute whose middle it covers) in ``[range_start, range_end)``.

    ``end`` may be null (still open). Adds a ``minute`` column (UTC, ms). ``every``: only
    the minutes ``range_start + k·every`` (a sampled grid): months of intervals are not
    first expanded to every minute.
    """
    return engines.step_frame(
        minute_rows(intervals, start, end, range_start, range_end, every))


def minute_rows(intervals: pl.DataFrame | pl.LazyFrame, start: str, end: str,
                range_start: datetime, range_end: datetime, every: int = 1) -> pl.LazyFrame:
    """The plan of :func:`expand_to_minutes`, for a caller that goes on with it (and
    need never hold a row per interval and minute)."""
    step, lo = every * MINUTE_MS, ms(range_start)
    spans = middle_span(intervals, start, end, range_start, range_end)
    if every > 1:  # each span's first minute on the grid
        spans = spans.with_columns(
            (lo + (pl.col("_first") - lo + (step - 1)) // step * step).alias("_first")
        ).filter(pl.col("_first") < pl.col("_stop"))
    return (
        spans
        .with_columns(
            pl.int_ranges(pl.col("_first"), pl.col("_stop"), step).alias("minute")
        )
        .explode("minute")
        .with_columns(to_time(pl.col("minute")).alias("minute"))
        .drop("_first", "_stop")
    )


def sweep_minutes(spans: pl.LazyFrame, by: list[str], start: str, stop: str) -> pl.LazyFrame:
    """Per ``by`` key and minute: how many of ``spans`` cover it (``n``), where a span
    covers the minutes ``[start, stop)`` (whole minutes, ms). A sweep over the spans'
    ends: the cost follows the changes of each key's count, never a row per span and
    minute. Only minutes with ``n > 0``; ``minute`` in ms."""
    deltas = pl.concat([
        spans.select(*by, pl.col(start).alias("t"), pl.lit(1, pl.Int64).alias("d")),
        spans.select(*by, pl.col(stop).alias("t"), pl.lit(-1, pl.Int64).alias("d")),
    ]).group_by([*by, "t"]).agg(pl.col("d").sum()).sort([*by, "t"])
    steps = deltas.with_columns(
        pl.col("d").cum_sum().over(by).alias("n"),
        pl.col("t").shift(-1).over(by).alias("t_next"),
    ).filter((pl.col("n") > 0) & pl.col("t_next").is_not_null())
    return steps.select(
        pl.int_ranges(pl.col("t"), pl.col("t_next"), MINUTE_MS).alias("minute"), *by, "n",
    ).explode("minute")


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
