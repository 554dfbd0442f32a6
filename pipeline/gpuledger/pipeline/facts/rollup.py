"""Hourly and daily roll-ups of GPU-minutes, by pool, card type, team, queue, job type.

Each state becomes a column of GPU-hours, so that the core measures are plain sums:
``allocated_gpu_hours`` = idle + inefficient + busy; ``available_gpu_hours`` =
all − unavailable; ``allocation_rate`` = allocated / available;
``utilisation_of_allocation`` = used / allocated.
"""

from __future__ import annotations

import polars as pl

from gpuledger.pipeline.facts.gpu_state import ALLOCATED_STATES, STATES

DIMENSIONS = ["pool", "card_type", "team", "queue", "job_type"]
MEASURES = [
    "gpu_hours", "allocated_gpu_hours", "used_gpu_hours",
    *[f"{s}_gpu_hours" for s in STATES], "no_telemetry_gpu_hours",
]


def hourly(gpu_minutes: pl.DataFrame) -> pl.DataFrame:
    """Roll GPU-minute facts up to the hour."""
    state = pl.col("state").cast(pl.String)
    allocated = state.is_in(list(ALLOCATED_STATES))
    return (
        gpu_minutes.with_columns(pl.col("minute").dt.truncate("1h").alias("hour"))
        .group_by(["hour", *DIMENSIONS])
        .agg(
            (pl.len() / 60.0).alias("gpu_hours"),
            (allocated.sum() / 60.0).alias("allocated_gpu_hours"),
            (pl.when(allocated).then(pl.col("activity").fill_null(0.0)).otherwise(0.0).sum()
             / 60.0).alias("used_gpu_hours"),
            *[((state == s).sum() / 60.0).alias(f"{s}_gpu_hours") for s in STATES],
            ((allocated & (pl.col("telemetry_samples").fill_null(0) == 0)).sum() / 60.0)
            .alias("no_telemetry_gpu_hours"),
        )
        .with_columns(pl.col("hour").dt.date().alias("date"))
        .sort(["hour", *DIMENSIONS], nulls_last=True)
    )


def daily(hourly_rows: pl.DataFrame) -> pl.DataFrame:
    """Roll hourly rows up to the day."""
    return (
        hourly_rows.group_by(["date", *DIMENSIONS])
        .agg([pl.col(m).sum() for m in MEASURES])
        .sort(["date", *DIMENSIONS], nulls_last=True)
    )
