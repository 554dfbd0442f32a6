"""The GPU-minute state: the one place where a GPU-minute is classified.

Every GPU-minute is exactly one of (DESIGN.md, Facts):

=========================  ===========================================================
``unavailable``            node down, GPU unhealthy (inventory list, XID/ECC, lost), or
                           node not schedulable (drained/cordoned) *and* not allocated
``no_telemetry``           allocated, but no sample of the GPU in the minute: activity
                           unknown, so neither idle nor used (never counted as waste)
``allocated_idle``         allocated; activity < ``idle_activity`` (default 0.05)
``allocated_inefficient``  allocated; activity < ``efficient_activity`` (default 0.30)
``allocated_busy``         allocated; activity ≥ ``efficient_activity``
``unaccounted_use``        not allocated, yet activity ≥ ``idle_activity`` or a process
``free``                   schedulable, healthy, not allocated, no use
=========================  ===========================================================

Activity of a sample is DCGM ``sm_active`` when present, else NVML ``utilization.gpu``
/ 100; the minute's activity is the mean over its samples. A drained node's GPUs that
still run a job stay allocated (drain stops new work only); a down node or an unhealthy
GPU is unavailable even when a job holds it.

A GPU-minute held for part of the minute (or by a fraction of the GPU) has ``state`` of
its allocated part; the roll-ups split it by share (:func:`rest_state`), so states
always add up to capacity (docs/metrics.md, *Partly allocated minutes*).
"""

from __future__ import annotations

import polars as pl

from gpuledger.pipeline.config import Thresholds

STATES = (
    "free",
    "allocated_idle",
    "allocated_inefficient",
    "allocated_busy",
    "unaccounted_use",
    "unavailable",
    "no_telemetry",
)
ALLOCATED_STATES = ("allocated_idle", "allocated_inefficient", "allocated_busy", "no_telemetry")
OBSERVED_ALLOCATED_STATES = ("allocated_idle", "allocated_inefficient", "allocated_busy")

TOLERANCE = 1e-7
"""Activity within this of a threshold counts as at the threshold: a mean of samples at
exactly 70 % must not fall below it by floating-point summation or by its storage as a
32-bit float (0.7 is stored as 0.69999999, ``telemetry_minutes.READING_DTYPE``)."""


def below(activity: pl.Expr, threshold: float) -> pl.Expr:
    """``activity < threshold``, robust to floating-point summation."""
    return activity < threshold - TOLERANCE


def sample_activity() -> pl.Expr:
    """Activity of one telemetry sample (0–1)."""
    return pl.coalesce(pl.col("sm_active"), pl.col("util_gpu") / 100.0)


def classify(thresholds: Thresholds) -> pl.Expr:
    """Expression for the ``state`` column.

    Needs boolean columns ``unhealthy`` (down node / bad GPU), ``schedulable``,
    ``allocated``, ``has_process``, int ``telemetry_samples`` and float ``activity``
    (null = no telemetry).
    """
    activity = pl.col("activity").fill_null(0.0)
    observed = pl.col("telemetry_samples") > 0
    return (
        pl.when(pl.col("unhealthy"))
        .then(pl.lit("unavailable"))
        .when(pl.col("allocated") & ~observed)
        .then(pl.lit("no_telemetry"))
        .when(pl.col("allocated") & below(activity, thresholds.idle_activity))
        .then(pl.lit("allocated_idle"))
        .when(pl.col("allocated") & below(activity, thresholds.efficient_activity))
        .then(pl.lit("allocated_inefficient"))
        .when(pl.col("allocated"))
        .then(pl.lit("allocated_busy"))
        .when(~pl.col("schedulable"))
        .then(pl.lit("unavailable"))
        .when(~below(activity, thresholds.idle_activity) | pl.col("has_process"))
        .then(pl.lit("unaccounted_use"))
        .otherwise(pl.lit("free"))
        .alias("state")
    )


def rest_state() -> pl.Expr:
    """The state of the part of a GPU-minute no job held (an allocated minute's rest):
    the minute's own state when nothing was held; else unavailable on an unhealthy GPU
    or an unschedulable node, and free otherwise (the minute's activity belongs to the
    allocation)."""
    return (
        pl.when(~pl.col("allocated")).then(pl.col("state"))
        .when(pl.col("unhealthy") | ~pl.col("schedulable")).then(pl.lit("unavailable"))
        .otherwise(pl.lit("free"))
    )
