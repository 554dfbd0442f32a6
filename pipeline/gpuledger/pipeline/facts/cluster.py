"""Cluster-wide facts of a close step: fragmentation, pending and blocked demand.

Computed from scheduler and inventory state only (never from telemetry), as snapshots
at each minute's middle (``facts/minutes.py``): a GPU is free in minute ``m`` when no
allocation covers ``m + 30 s``; a job is pending in ``m`` when its pending interval
covers ``m + 30 s``. Only the instance that holds partition 0 computes them
(``partitions.py``), for every node of the cluster.

The free GPUs of each node and minute come from the node's inventory runs and the
allocations' middle-aligned minute ranges (``fragmentation.free_per_node``), without
a row per GPU-minute; ``fragmentation.py`` and ``demand.py`` hold the definitions.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import polars as pl

from gpuledger.pipeline.facts import demand
from gpuledger.pipeline.facts.fragmentation import fragmentation, free_per_node
from gpuledger.pipeline.facts.minutes import expand_to_minutes, minute_range
from gpuledger.pipeline.tables import TABLE_SCHEMAS


@dataclass
class ClusterFacts:
    """One step's cluster-wide fact frames, and the latest free blocks (for back-fill)."""

    frag_minute: pl.DataFrame
    pending_minute: pl.DataFrame
    blocked_minute: pl.DataFrame
    free_blocks: pl.DataFrame | None


def cluster_facts(node_runs: pl.DataFrame, allocations: pl.DataFrame,
                  pending: pl.DataFrame, attrs: pl.DataFrame, starts: pl.DataFrame,
                  a: datetime, b: datetime) -> ClusterFacts:
    """Fragmentation, pending and blocked demand for the minutes ``[a, b)``.

    ``node_runs``: every node's inventory runs clipped to the step; ``allocations`` and
    ``pending``: the job book's intervals; ``starts``: attempts started in the day before
    the step (fallback weights of the demand-weighted rate)."""
    minutes = minute_range(a, b)
    nodes = free_per_node(node_runs, expand_to_minutes(
        allocations.select("node", "gpu_index", "start", "end"), "start", "end", a, b))
    frag = fragmentation(nodes)
    free_blocks = None
    if not frag.is_empty():
        last = frag.filter(pl.col("minute") == pl.col("minute").max())
        free_blocks = last.select("pool", "card_type", "largest_free_block")
    pend = expand_to_minutes(pending, "queued_at", "end", a, b).join(
        attrs.select("job_id", "team", "queue", "pool", "card_type", "gpus", "priority"),
        on="job_id", how="left",
    ).with_columns(pl.col("gpus").fill_null(1))
    blocked = demand.blocked_jobs(pend.select(
        "minute", "job_id", "attempt", "team", "queue", "pool", "card_type", "gpus",
        "priority"), nodes)
    weighted = demand.demand_weighted(pend, starts, nodes, minutes)
    # a job that accepts any card type is demand on each card type of its pool
    cards = nodes.select("minute", "pool", "card_type").unique()
    counts = demand.any_card_to_each(blocked, cards).group_by(
        ["minute", "pool", "card_type"]).agg(
        pl.len().cast(pl.Int64).alias("pending_jobs"),
        pl.col("gpus").sum().alias("pending_gpus"),
        pl.col("blocked").sum().cast(pl.Int64).alias("blocked_jobs"),
        pl.when(pl.col("blocked")).then(pl.col("gpus")).otherwise(0).sum()
        .alias("blocked_gpus"),
    )
    frag_out = (
        frag.join(weighted, on=["minute", "pool", "card_type"], how="left")
        .join(counts, on=["minute", "pool", "card_type"], how="left")
        .with_columns(pl.col(c).fill_null(0) for c in (
            "pending_jobs", "pending_gpus", "blocked_jobs", "blocked_gpus"))
        .with_columns(pl.col("minute").dt.date().alias("date"))
    )
    pending_out = blocked.group_by(["minute", "queue", "pool", "card_type", "team"]).agg(
        pl.len().cast(pl.Int64).alias("pending_jobs"),
        pl.col("gpus").sum().alias("pending_gpus"),
        pl.col("blocked").sum().cast(pl.Int64).alias("blocked_jobs"),
        pl.when(pl.col("blocked")).then(pl.col("gpus")).otherwise(0).sum()
        .alias("blocked_gpus"),
    ).with_columns(pl.col("minute").dt.date().alias("date"))
    blocked_out = blocked.filter(pl.col("blocked")).with_columns(
        pl.col("minute").dt.date().alias("date"))
    return ClusterFacts(
        frag_out.select(TABLE_SCHEMAS["frag_minute"].names()),
        pending_out.select(TABLE_SCHEMAS["pending_minute"].names()),
        blocked_out.select(TABLE_SCHEMAS["blocked_minute"].names()),
        free_blocks,
    )


def starts_window(a: datetime) -> datetime:
    """The oldest start a step beginning at ``a`` needs (a day before it)."""
    return a - timedelta(days=1)
