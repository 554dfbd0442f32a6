"""Hourly and daily roll-ups of GPU-minutes, by pool, card type, team, queue, job type.

Allocation is charged **by share** everywhere (docs/metrics.md, *Three measures of
allocation*): a GPU-minute is split between the jobs that held it, each by its share
(fraction × seconds held / 60), and the rest of the minute (no job held it) keeps the
GPU's own state with no team. So states always add up to capacity, and a team is charged
exactly what its jobs held. Three measures of allocation are kept apart:

- ``allocated_gpu_hours`` — **GPU shares**: Σ fraction × time held (a job on half a GPU
  for an hour: 0.5). Allocated = idle + inefficient + busy + no_telemetry;
- ``occupied_gpu_hours`` — **GPUs occupied**: time a GPU had at least one job, whatever
  the fractions (that half-GPU job: 1.0), shared out between its jobs by share;
- ``job_gpu_hours`` — **pods × GPUs**: Σ time held per (job, GPU), whatever the fraction
  (two jobs on halves of one GPU for an hour: 2.0).

Each state becomes a column of GPU-hours, so the core measures are plain sums:
``available_gpu_hours`` = all − unavailable; ``allocation_rate`` = allocated /
available; ``utilisation_of_allocation`` = used / (allocated − no_telemetry).
"""

from __future__ import annotations

import polars as pl

from gpuledger.pipeline.facts import fixed
from gpuledger.pipeline.facts.gpu_state import (
    ALLOCATED_STATES,
    OBSERVED_ALLOCATED_STATES,
    STATES,
    rest_state,
)
from gpuledger.pipeline.facts.minutes import HOUR_MS

DIMENSIONS = ["pool", "card_type", "team", "queue", "job_type"]
MEASURES = [
    "gpu_hours", "allocated_gpu_hours", "used_gpu_hours",
    *[f"{s}_gpu_hours" for s in STATES], "occupied_gpu_hours", "job_gpu_hours",
]
PARTIAL_KEYS = ["hour_ms", "partition", *DIMENSIONS]


def share_rows(gpu: pl.LazyFrame, jobs: pl.LazyFrame) -> pl.LazyFrame:
    """Rows of (hour, partition, dimensions, state) with GPU-minute weights.

    ``gpu``: GPU rows (``gpu_minutes.py``); ``jobs``: job rows with their GPU context and
    the job's team, queue and job type."""
    over = pl.max_horizontal(pl.col("alloc_fraction"), pl.lit(1.0))
    weight = pl.col("share") / over * pl.col("n_minutes")
    observed = pl.col("state").is_in(list(OBSERVED_ALLOCATED_STATES))
    held = jobs.select(
        "minute_ms", "partition", "pool", "card_type", "team", "queue", "job_type", "state",
        weight.alias("w"),
        pl.when(observed).then(weight * pl.col("activity")).otherwise(0.0).alias("used"),
        pl.when(pl.col("alloc_fraction") > 0)
        .then(pl.col("occupied_share") * pl.col("n_minutes") * pl.col("share")
              / pl.col("alloc_fraction")).otherwise(0.0).alias("occupied"),
        (pl.col("held") * pl.col("n_minutes")).alias("job_gpu"),
    )
    rest = gpu.select(
        "minute_ms", "partition", "pool", "card_type",
        pl.lit(None, pl.String).alias("team"), pl.lit(None, pl.String).alias("queue"),
        pl.lit(None, pl.String).alias("job_type"),
        rest_state().alias("state"),
        ((1.0 - pl.min_horizontal(pl.col("alloc_fraction"), pl.lit(1.0))) * pl.col("n_minutes"))
        .alias("w"),
        pl.lit(0.0).alias("used"), pl.lit(0.0).alias("occupied"), pl.lit(0.0).alias("job_gpu"),
    ).filter(pl.col("w") > 0)
    return pl.concat([held, rest], how="vertical_relaxed").with_columns(
        ((pl.col("minute_ms") // HOUR_MS) * HOUR_MS).alias("hour_ms"))


def hourly_partial(rows: pl.LazyFrame) -> pl.LazyFrame:
    """Share rows → the measures per (hour, partition, dimensions), in fixed-point units
    (``fixed.py``): one partial of an hour's roll-up. Partials of the same hour add up
    exactly, however the hour's minutes were stepped."""
    state = pl.col("state")
    w = fixed.units(pl.col("w"))
    return rows.group_by(PARTIAL_KEYS).agg(
        w.sum().alias("gpu_hours"),
        w.filter(state.is_in(list(ALLOCATED_STATES))).sum().alias("allocated_gpu_hours"),
        fixed.units(pl.col("used")).sum().alias("used_gpu_hours"),
        *[w.filter(state == s).sum().alias(f"{s}_gpu_hours") for s in STATES],
        fixed.units(pl.col("occupied")).sum().alias("occupied_gpu_hours"),
        fixed.units(pl.col("job_gpu")).sum().alias("job_gpu_hours"),
    )


def conform(partial: pl.DataFrame) -> pl.DataFrame:
    """A partial as this version holds it (an older checkpoint held GPU-hours as floats)."""
    return fixed.conform(partial, MEASURES, 1 / 60)


def hourly(partials: pl.DataFrame) -> pl.DataFrame:
    """One hour's roll-up rows (``gpu_hourly``, GPU-hours) from its partials."""
    return partials.group_by(PARTIAL_KEYS).agg(
        fixed.to_hours(pl.col(m).sum()) for m in MEASURES
    ).with_columns(
        pl.col("hour_ms").cast(pl.Datetime("ms")).dt.replace_time_zone("UTC").alias("hour"),
    ).with_columns(pl.col("hour").dt.date().alias("date")).sort(
        ["hour", *DIMENSIONS], nulls_last=True)


def daily(hourly_rows: pl.DataFrame, by: tuple[str, ...] = ()) -> pl.DataFrame:
    """Roll hourly rows up to the day (``by``: more keys kept apart, such as the
    telemetry partition, so that one pass serves them all)."""
    return (
        hourly_rows.group_by([*by, "date", *DIMENSIONS])
        .agg([pl.col(m).sum() for m in MEASURES])
        .sort([*by, "date", *DIMENSIONS], nulls_last=True)
    )
