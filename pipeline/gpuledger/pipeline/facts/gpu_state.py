"""The GPU-minute state: the one place where a GPU-minute is classified.

Every GPU-minute is exactly one of (DESIGN.md, Facts):

=========================  ===========================================================
``unavailable``            node down, GPU unhealthy (inventory list, XID/ECC, lost), or
                           node not schedulable (drained/cordoned) *and* not allocated
``allocated_idle``         allocated; activity < ``idle_activity`` (default 0.05)
``allocated_inefficient``  allocated; activity < ``efficient_activity`` (default 0.30)
``allocated_busy``         allocated; activity ≥ ``efficient_activity``
``unaccounted_use``        not allocated, yet activity ≥ ``idle_activity`` or a process
``free``                   schedulable, healthy, not allocated, no use
=========================  ===========================================================

Activity of a sample is DCGM ``sm_active`` when present, else NVML ``utilization.gpu``
/ 100; the minute's activity is the mean over its samples. An allocated GPU-minute
without any telemetry counts as activity 0 (``telemetry_samples`` = 0 tells it apart).
A drained node's GPUs that still run a job stay allocated (drain stops new work only);
a down node or an unhealthy GPU is unavailable even when a job holds it.
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
)
ALLOCATED_STATES = ("allocated_idle", "allocated_inefficient", "allocated_busy")

TOLERANCE = 1e-9
"""Activity within this of a threshold counts as at the threshold (a mean of samples at
exactly 5 % must not fall to 4.999999 % by floating-point summation)."""


def below(activity: pl.Expr, threshold: float) -> pl.Expr:
    """``activity < threshold``, robust to floating-point summation."""
    return activity < threshold - TOLERANCE


def sample_activity() -> pl.Expr:
    """Activity of one telemetry sample (0–1)."""
    return pl.coalesce(pl.col("sm_active"), pl.col("util_gpu") / 100.0)


def classify(thresholds: Thresholds) -> pl.Expr:
    """Expression for the ``state`` column.

    Needs boolean columns ``unhealthy`` (down node / bad GPU), ``schedulable``,
    ``allocated``, ``has_process`` and float ``activity`` (null = no telemetry).
    """
    activity = pl.col("activity").fill_null(0.0)
    return (
        pl.when(pl.col("unhealthy"))
        .then(pl.lit("unavailable"))
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
        .cast(pl.Enum(STATES))
        .alias("state")
    )
