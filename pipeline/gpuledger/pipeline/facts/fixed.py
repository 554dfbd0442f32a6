"""Fixed-point GPU-minutes: sums that do not depend on the order they are added in.

A job's usage per GPU and an hour's roll-up are added up over many close steps. Where the
steps fall depends on how the input arrives: one instance or two, a restart, a rebalance.
Floating-point addition depends on its order, so float accumulators came out different in
the last digit (docs/kafka.md). These accumulators hold integers instead: each row's
GPU-minutes are rounded once, to ``1 / UNITS_PER_MINUTE`` of a GPU-minute (60 ns), and
integer sums are exact in any order. A fact is one division of an exact sum, so the same
input gives the same bits however it was stepped.

Rounding each row to 60 ns changes a fact by at most rows × 30 ns: 1e-9 GPU-hours after
~120,000 rows, far below the 9 decimals facts are written with.
"""

from __future__ import annotations

import polars as pl

UNITS_PER_MINUTE = 1_000_000_000
"""Units of an accumulator per GPU-minute. Int64 holds 9.2e9 GPU-minutes: 17,000 GPU-years
in one sum."""
UNITS_PER_HOUR = 60 * UNITS_PER_MINUTE


def units(gpu_minutes: pl.Expr) -> pl.Expr:
    """A row's GPU-minutes (float) as integer units, rounded to the nearest."""
    return (gpu_minutes * UNITS_PER_MINUTE).round().cast(pl.Int64)


def to_minutes(summed: pl.Expr) -> pl.Expr:
    """Summed units as GPU-minutes."""
    return summed / UNITS_PER_MINUTE


def to_hours(summed: pl.Expr) -> pl.Expr:
    """Summed units as GPU-hours."""
    return summed / UNITS_PER_HOUR


def conform(frame: pl.DataFrame, columns: list[str], per_unit: float) -> pl.DataFrame:
    """``frame`` with ``columns`` as units: a frame from an older checkpoint or instance
    holds them as floats, ``per_unit`` of them (1 for minutes, 1/60 for hours) per
    GPU-minute."""
    floats = [c for c in columns if c in frame.columns and frame.schema[c].is_float()]
    if not floats:
        return frame
    return frame.with_columns(units(pl.col(c) / per_unit).alias(c) for c in floats)
