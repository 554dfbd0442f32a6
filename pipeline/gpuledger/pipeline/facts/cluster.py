"""Cluster-wide facts of a close step: fragmentation, pending and blocked demand.

Computed from scheduler and inventory state only (never from telemetry), as snapshots
at each minute's middle (``facts/minutes.py``): a GPU is free in minute ``m`` when no
allocation covers ``m + 30 s``; a job is pending in ``m`` when its pending interval
covers ``m + 30 s``. Only the instance that holds partition 0 computes them
(``partitions.py``), for every node of the cluster.

The cost follows the changes, not the node-minutes (a 1,213-node history without
telemetry has 1.7 M node-minutes a day but a few thousand changes):

1. **node segments** — each node's time cut wherever its inventory or the allocations
   on it change, with the node's free whole GPUs ``f`` on each piece;
2. a **histogram** per minute: how many nodes of each pool, card type and size have
   each number of free GPUs (a few rows per pool and minute);
3. pending jobs per minute and **cohort** (team, queue, pool, card type, GPUs: jobs that
   every pending fact treats alike), by a sweep over the pending intervals' ends, so a
   queue of thousands costs a row per cohort and minute, not per job and minute;
4. fragmentation (``fragmentation.py``), blocked demand and the demand-weighted rate
   (``demand.py``) from the histogram and the cohorts; only ``blocked_minute``, a row
   per blocked job and minute, goes back to the jobs of the cohorts blocked.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import polars as pl

from gpuledger.pipeline import engines
from gpuledger.pipeline.facts import demand
from gpuledger.pipeline.facts.fragmentation import fragmentation
from gpuledger.pipeline.facts.minutes import (
    HALF_MINUTE_MS,
    MINUTE_MS,
    ceil_minute_ms,
    middle_span,
    ms,
    sweep_minutes,
    to_time,
)
from gpuledger.pipeline.tables import TABLE_SCHEMAS

NODE = ["node"]
BIN = ["pool", "card_type", "node_gpus", "free"]
COHORT = ["team", "queue", "pool", "card_type", "gpus"]
"""Pending jobs alike for every pending fact: counted together, never one by one."""
_JOBS, _GPUS, _BLOCKED = pl.col("jobs"), pl.col("gpus") * pl.col("jobs"), pl.col("blocked")
_DEMAND = (
    _JOBS.sum().cast(pl.Int64).alias("pending_jobs"),
    _GPUS.sum().cast(pl.Int64).alias("pending_gpus"),
    _JOBS.filter(_BLOCKED).sum().cast(pl.Int64).alias("blocked_jobs"),
    _GPUS.filter(_BLOCKED).sum().cast(pl.Int64).alias("blocked_gpus"),
)


@dataclass
class ClusterFacts:
    """One step's cluster-wide fact frames, and the latest free blocks (for back-fill)."""

    frag_minute: pl.DataFrame
    pending_minute: pl.DataFrame
    blocked_minute: pl.DataFrame
    free_blocks: pl.DataFrame | None


def busy_ranges(allocations: pl.DataFrame, a_ms: int, b_ms: int) -> pl.LazyFrame:
    """Per GPU, the minutes ``[s_m, e_m)`` whose middle some allocation covers (any
    fraction: a shared GPU is not free), overlapping allocations merged."""
    start = pl.col("start").cast(pl.Int64)
    end = pl.col("end").cast(pl.Int64).fill_null(b_ms + MINUTE_MS)
    ranges = allocations.lazy().select(
        "node", "gpu_index",
        pl.max_horizontal(ceil_minute_ms(start - HALF_MINUTE_MS), pl.lit(a_ms)).alias("s_m"),
        pl.min_horizontal(ceil_minute_ms(end - HALF_MINUTE_MS), pl.lit(b_ms)).alias("e_m"),
    ).filter(pl.col("s_m") < pl.col("e_m")).sort(["node", "gpu_index", "s_m"])
    reach = pl.col("e_m").cum_max().shift(1).over(["node", "gpu_index"])
    return (
        ranges.with_columns((pl.col("s_m") > reach).fill_null(True).cum_sum()
                            .over(["node", "gpu_index"]).alias("_run"))
        .group_by(["node", "gpu_index", "_run"])
        .agg(pl.col("s_m").min(), pl.col("e_m").max())
        .drop("_run")
    )


def node_segments(node_runs: pl.DataFrame, busy: pl.LazyFrame) -> pl.LazyFrame:
    """Each node's runs cut where a GPU of it becomes busy or free: ``(node, u, v)`` with
    the run's pool, card type, ``node_gpus``, ``node_ok`` (schedulable, not down) and
    ``free`` (healthy GPUs with no allocation)."""
    runs = node_runs.lazy().select(
        "node", "from_ms", "to_ms", "pool", "card_type",
        pl.col("gpu_count").alias("node_gpus"),
        (pl.col("schedulable") & (pl.col("health") != "down")).fill_null(False).alias("node_ok"),
        pl.col("unhealthy_gpus").fill_null(pl.lit([], pl.List(pl.Int64()))).alias("_bad"),
    )
    # busy ranges of GPUs that count: within the node's GPUs and healthy in that run
    held = busy.join(runs.select("node", "from_ms", "to_ms", "node_gpus", "_bad"),
                     on="node", how="inner").filter(
        (pl.col("s_m") < pl.col("to_ms")) & (pl.col("e_m") > pl.col("from_ms"))
        & (pl.col("gpu_index") < pl.col("node_gpus"))
        & ~pl.col("_bad").list.contains(pl.col("gpu_index"))
    ).select("node", "from_ms",
             pl.max_horizontal("s_m", "from_ms").alias("s"),
             pl.min_horizontal("e_m", "to_ms").alias("e"))
    cuts = pl.concat([
        runs.select("node", "from_ms", pl.col("from_ms").alias("t")),
        runs.select("node", "from_ms", pl.col("to_ms").alias("t")),
        held.select("node", "from_ms", pl.col("s").alias("t")),
        held.select("node", "from_ms", pl.col("e").alias("t")),
    ]).unique().sort(["node", "from_ms", "t"])
    segments = cuts.with_columns(pl.col("t").shift(-1).over(["node", "from_ms"]).alias("v"))\
        .filter(pl.col("v").is_not_null()).rename({"t": "u"})
    taken = segments.join(held, on=["node", "from_ms"], how="inner").filter(
        (pl.col("s") <= pl.col("u")) & (pl.col("e") >= pl.col("v"))
    ).group_by(["node", "from_ms", "u"]).agg(pl.len().cast(pl.Int64).alias("_busy"))
    healthy = pl.col("node_gpus") - pl.col("_bad").list.unique().list.len().cast(pl.Int64)
    return (
        segments.join(runs, on=["node", "from_ms"], how="inner")
        .join(taken, on=["node", "from_ms", "u"], how="left")
        .with_columns((healthy - pl.col("_busy").fill_null(0)).clip(0, None).alias("free"))
        .select("node", "u", "v", "pool", "card_type", "node_gpus", "node_ok", "free")
    )


def histogram(segments: pl.LazyFrame) -> pl.DataFrame:
    """Per minute, pool, card type and node size: how many schedulable, healthy nodes
    have each number of free GPUs (``nodes``). A pool and card type whose nodes are all
    down or drained in a minute keeps a row there, with no free GPU and no node: its
    minute of fragmentation says so, and its pending jobs are counted in it (they were
    left out with the row)."""
    ok = sweep_minutes(segments.filter(pl.col("node_ok")), BIN, "u", "v").select(
        "minute", *BIN, pl.col("n").alias("nodes"))
    out = segments.filter(~pl.col("node_ok")).with_columns(pl.lit(0, pl.Int64).alias("free"))
    none_ok = sweep_minutes(out, BIN, "u", "v").select(
        "minute", *BIN, pl.lit(0, pl.Int64).alias("nodes")).unique().join(
        ok, on=["minute", "pool", "card_type"], how="anti", nulls_equal=True)
    return engines.step_frame(pl.concat([ok, none_ok.select(ok.collect_schema().names())],
                                        how="vertical_relaxed").select(
        to_time(pl.col("minute")).alias("minute"), *BIN, "nodes"))


def cluster_facts(node_runs: pl.DataFrame, allocations: pl.DataFrame,
                  pending: pl.DataFrame, attrs: pl.DataFrame, starts: pl.DataFrame,
                  a: datetime, b: datetime) -> ClusterFacts:
    """Fragmentation, pending and blocked demand for the minutes ``[a, b)``.

    ``node_runs``: every node's inventory runs clipped to the step; ``allocations`` and
    ``pending``: the job book's intervals; ``starts``: attempts started in the day before
    the step (fallback weights of the demand-weighted rate)."""
    a_ms, b_ms = ms(a), ms(b)
    # each stage collected before the next reads it: the segments read the busy ranges
    # four times and the histogram reads the segments twice, and one plan of the three
    # ran every copy (40 ms an hour of the benchmark's cluster, against 9 ms in stages)
    busy = engines.step_frame(busy_ranges(allocations, a_ms, b_ms))
    segments = engines.step_frame(node_segments(node_runs, busy.lazy()))
    hist = histogram(segments.lazy())
    frag = fragmentation(hist)
    free_blocks = None
    if not frag.is_empty():
        last = frag.filter(pl.col("minute") == pl.col("minute").max())
        free_blocks = last.select("pool", "card_type", "largest_free_block")
    spans = engines.step_frame(middle_span(pending, "queued_at", "end", a, b).join(
        attrs.lazy().select("job_id", *COHORT, "priority"), on="job_id",
        how="left",
    ).with_columns(pl.col("gpus").fill_null(1)))
    # pending jobs per minute and cohort, by a sweep: a long queue costs a row per cohort
    # and minute, not per job and minute
    pend = engines.step_frame(sweep_minutes(spans.lazy(), COHORT, "_first", "_stop").select(
        to_time(pl.col("minute")).alias("minute"), *COHORT, pl.col("n").alias("jobs")))
    blocked = demand.blocked_jobs(pend, hist)
    weighted = demand.demand_weighted(pend, starts, hist, a, b)
    # a job that accepts any card type is demand on each card type of its pool
    cards = hist.select("minute", "pool", "card_type").unique()
    counts = demand.any_card_to_each(blocked, cards).group_by(
        ["minute", "pool", "card_type"]).agg(*_DEMAND)
    frag_out = (
        frag.join(weighted, on=["minute", "pool", "card_type"], how="left")
        .join(counts, on=["minute", "pool", "card_type"], how="left")
        .with_columns(pl.col(c).fill_null(0) for c in (
            "pending_jobs", "pending_gpus", "blocked_jobs", "blocked_gpus"))
        .with_columns(pl.col("minute").dt.date().alias("date"))
    )
    pending_out = blocked.group_by(["minute", "queue", "pool", "card_type", "team"]).agg(
        *_DEMAND).with_columns(pl.col("minute").dt.date().alias("date"))
    blocked_out = blocked_job_minutes(spans, blocked).with_columns(
        pl.col("minute").dt.date().alias("date"))
    return ClusterFacts(
        frag_out.select(TABLE_SCHEMAS["frag_minute"].names()),
        pending_out.select(TABLE_SCHEMAS["pending_minute"].names()),
        blocked_out.select(TABLE_SCHEMAS["blocked_minute"].names()),
        free_blocks,
    )


def blocked_job_minutes(spans: pl.DataFrame, blocked: pl.DataFrame) -> pl.DataFrame:
    """A row per blocked job and minute (``blocked_minute``): the pending ``spans`` of the
    cohorts blocked in some minute, expanded to their minutes and kept where their cohort
    is blocked."""
    hit = blocked.lazy().filter(pl.col("blocked")).select(
        "minute", *COHORT, "free_gpus", "largest_free_block")
    return engines.step_frame(
        spans.lazy().join(hit.select(COHORT).unique(), on=COHORT, how="semi", nulls_equal=True)
        .with_columns(pl.int_ranges(pl.col("_first"), pl.col("_stop"), MINUTE_MS)
                      .alias("minute"))
        .explode("minute")
        .with_columns(to_time(pl.col("minute")).alias("minute"))
        .join(hit, on=["minute", *COHORT], how="inner", nulls_equal=True))


def starts_window(a: datetime) -> datetime:
    """The oldest start a step beginning at ``a`` needs (a day before it)."""
    return a - timedelta(days=1)
