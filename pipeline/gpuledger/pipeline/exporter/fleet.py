"""Fleet gauges: GPUs by state, allocated vs used, capacity (latest closed minute)."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl
from prometheus_client.core import GaugeMetricFamily, Metric

from gpuledger.pipeline.exporter.families import gauge
from gpuledger.pipeline.exporter.snapshot import Snapshot
from gpuledger.pipeline.facts.gpu_state import ALLOCATED_STATES

ALLOC_LABELS = ["pool", "card_type", "team", "queue"]


class FleetCollector:
    """From the ``gpu_minute`` rows of the latest closed minute."""

    name = "fleet"

    def collect(self, snap: Snapshot) -> Iterator[Metric]:
        gpu = snap.table("gpu_minute")
        minute = GaugeMetricFamily(
            "gpuledger_facts_minute_timestamp_seconds",
            "Start of the closed minute (event time, Unix seconds) that the fact gauges describe.")
        if snap.minute is not None:
            minute.add_metric([], snap.minute.timestamp())
        yield minute
        if gpu.is_empty():
            gpu = pl.DataFrame(schema={"pool": pl.String, "card_type": pl.String,
                                       "team": pl.String, "queue": pl.String,
                                       "state": pl.String, "activity": pl.Float64})
        state = pl.col("state").cast(pl.String)
        allocated = state.is_in(list(ALLOCATED_STATES))
        by_state = gpu.with_columns(
            pl.when(allocated).then(pl.col("team").fill_null("unknown")).alias("team"),
            state.alias("state"),
        ).group_by(["pool", "card_type", "team", "state"]).agg(pl.len().alias("gpus"))
        yield gauge("gpuledger_gpus",
                    "GPUs in each state (free, allocated_idle, allocated_inefficient, "
                    "allocated_busy, unaccounted_use, unavailable); team is empty unless "
                    "allocated.", by_state, ["pool", "card_type", "team", "state"], "gpus",
                    empty=["team"])
        alloc = gpu.filter(allocated).group_by(ALLOC_LABELS).agg(
            pl.len().alias("allocated"),
            pl.col("activity").fill_null(0.0).sum().alias("used"),
        )
        yield gauge("gpuledger_allocated_gpus",
                    "Allocated GPUs (states allocated_idle, allocated_inefficient, "
                    "allocated_busy).", alloc, ALLOC_LABELS, "allocated")
        yield gauge("gpuledger_used_gpus",
                    "Used GPUs: the sum of activity (0-1) over allocated GPUs.", alloc,
                    ALLOC_LABELS, "used")
        avail = gpu.group_by(["pool", "card_type"]).agg(
            (state != "unavailable").sum().alias("available"))
        yield gauge("gpuledger_available_gpus",
                    "GPUs not unavailable (node down or drained, GPU unhealthy): capacity.",
                    avail, ["pool", "card_type"], "available")
