"""Fleet gauges: GPUs by state, allocated vs used, capacity (latest closed minute)."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl
from prometheus_client.core import GaugeMetricFamily, Metric

from gpuledger.pipeline.exporter.families import gauge
from gpuledger.pipeline.exporter.snapshot import Snapshot
from gpuledger.pipeline.facts.gpu_state import ALLOCATED_STATES, rest_state

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
        parts = gpu_parts(gpu, snap.allocations, snap.attributes)
        state = pl.col("state")
        allocated = state.is_in(list(ALLOCATED_STATES))
        by_state = parts.group_by(["pool", "card_type", "team", "state"]).agg(
            pl.col("gpus").sum())
        yield gauge("gpuledger_gpus",
                    "GPUs in each state (free, allocated_idle, allocated_inefficient, "
                    "allocated_busy, no_telemetry, unaccounted_use, unavailable), by "
                    "share: a GPU held in part counts its held part in its state, shared "
                    "between its jobs' teams, and the rest free (or unavailable); team is "
                    "empty unless allocated.", by_state, ["pool", "card_type", "team", "state"],
                    "gpus", empty=["team"])
        alloc = parts.filter(allocated).group_by(ALLOC_LABELS).agg(
            pl.col("gpus").sum().alias("allocated"), pl.col("used").sum())
        yield gauge("gpuledger_allocated_gpus",
                    "Allocated GPUs by share (states allocated_idle, allocated_inefficient, "
                    "allocated_busy, no_telemetry).", alloc, ALLOC_LABELS, "allocated")
        yield gauge("gpuledger_used_gpus",
                    "Used GPUs: the allocated share times activity (0-1), summed.", alloc,
                    ALLOC_LABELS, "used")
        avail = parts.group_by(["pool", "card_type"]).agg(
            pl.col("gpus").filter(state != "unavailable").sum().alias("available"))
        yield gauge("gpuledger_available_gpus",
                    "GPUs not unavailable (node down or drained, GPU unhealthy): capacity.",
                    avail, ["pool", "card_type"], "available")


GPU_COLUMNS = {"pool": pl.String, "card_type": pl.String, "node": pl.String,
               "gpu_index": pl.Int64, "state": pl.String, "allocated": pl.Boolean,
               "alloc_fraction": pl.Float64, "team": pl.String, "queue": pl.String,
               "activity": pl.Float64, "schedulable": pl.Boolean}


def gpu_parts(gpu: pl.DataFrame, allocations: pl.DataFrame,
              attributes: pl.DataFrame) -> pl.DataFrame:
    """The minute's GPUs split as the roll-ups split a GPU-minute (docs/metrics.md,
    *Partly allocated minutes*): the held part (``alloc_fraction``, at most 1) in the
    row's state, shared between the teams and queues of the jobs holding the GPU by
    their fractions (the row's own job where no allocation covers the minute's middle),
    with ``used`` = that part × activity; the rest in the GPU's own state with no team.
    Columns: pool, card_type, team, queue, state, gpus, used. Before, every row counted
    as one whole GPU of its named job's team: a GPU held 0.5 was one allocated GPU."""
    if gpu.is_empty():
        gpu = pl.DataFrame(schema=GPU_COLUMNS)
    state = pl.col("state").cast(pl.String)
    held = pl.min_horizontal(pl.col("alloc_fraction").fill_null(0.0), pl.lit(1.0))
    rows = gpu.select(
        "pool", "card_type", "node", "gpu_index", state.alias("state"),
        pl.col("allocated").fill_null(False).alias("allocated"), held.alias("_held"),
        "team", "queue", pl.col("activity").fill_null(0.0).alias("activity"),
        (pl.col("schedulable").fill_null(True)).alias("schedulable"),
        # a held GPU-minute is unavailable exactly where its GPU or node was unhealthy
        # (gpu_state.classify tests that first)
        (state == "unavailable").alias("unhealthy"))
    teams = _team_fractions(allocations, attributes)
    gpu_key = ["node", "gpu_index"]
    mine = rows.filter(pl.col("allocated")).join(teams, on=gpu_key, how="left")
    named = mine.filter(pl.col("_f").is_null()).select(
        "pool", "card_type", "team", "queue", "state", "activity",
        pl.col("_held").alias("gpus"))
    shared = mine.filter(pl.col("_f").is_not_null()).select(
        "pool", "card_type", pl.col("_team").alias("team"), pl.col("_queue").alias("queue"),
        "state", "activity",
        (pl.col("_held") * pl.col("_f") / pl.col("_f").sum().over(gpu_key)).alias("gpus"))
    held_parts = pl.concat([named, shared]).with_columns(
        (pl.col("gpus") * pl.col("activity")).alias("used"),
        pl.col("team").replace("", None).fill_null("unknown"),
    ).drop("activity")
    rest = rows.select(
        "pool", "card_type", pl.lit(None, pl.String).alias("team"),
        pl.lit(None, pl.String).alias("queue"), rest_state().alias("state"),
        (1.0 - pl.col("_held")).alias("gpus"), pl.lit(0.0).alias("used"),
    ).filter(pl.col("gpus") > 0)
    return pl.concat([held_parts.select(rest.columns), rest], how="vertical_relaxed")


def _team_fractions(allocations: pl.DataFrame, attributes: pl.DataFrame) -> pl.DataFrame:
    """Per GPU, team and queue: the fractions its jobs hold at the minute's middle."""
    schema = {"node": pl.String, "gpu_index": pl.Int64, "_team": pl.String,
              "_queue": pl.String, "_f": pl.Float64}
    if allocations.is_empty() or attributes.is_empty():
        return pl.DataFrame(schema=schema)
    return allocations.select("job_id", "node", "gpu_index", "fraction").join(
        attributes.select("job_id", pl.col("team").alias("_team"),
                          pl.col("queue").alias("_queue")), on="job_id", how="left",
    ).group_by("node", "gpu_index", "_team", "_queue").agg(
        pl.col("fraction").sum().alias("_f")).filter(pl.col("_f") > 0).cast(
        schema)  # type: ignore[arg-type]
