"""The answers of a schedule (replayed, or as run), with the warehouse's own definitions.

Columnar and vectorised: allocations and pending times are expanded to the history's
minute grid (every ``step`` minutes) — held shares exact to the second
(:func:`facts.minutes.expand_held`), free GPUs and pending jobs as snapshots at each
minute's middle (:func:`facts.minutes.expand_to_minutes`) — and frag(k) and blocked
demand come from the facts' own functions (:func:`facts.fragmentation.fragmentation`,
:func:`facts.demand.blocked_jobs`) over the same free-GPU histogram, so an answer means
here what it means in the facts (``docs/metrics.md``):

- ``wait``: queue wait (start − queue time) of the attempts started in the window,
  p50/p90/p99 in minutes, by queue, by job size (GPUs) and overall;
- ``blocked``: blocked demand GPU-hours (pending jobs that fit in the free GPUs of their
  pool but on no node), by pool;
- ``frag``: mean frag(k), k = 1, 2, 4, 8, by pool and card type; ``frag_hourly`` over time;
- ``usage``: available, allocated and used GPU-hours by pool (used: each job's observed
  activity per allocated GPU-hour);
- ``lost``: preemptions and lost work (GPUs × time since the last checkpoint) by team;
- ``teams``: per team, what it waited, held, used, lost and was blocked.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from gpuledger.pipeline.advisor.history import History
from gpuledger.pipeline.advisor.replay import Run
from gpuledger.pipeline.columns import TIME_DTYPE
from gpuledger.pipeline.facts import demand
from gpuledger.pipeline.facts.fragmentation import FRAG_KS, fragmentation
from gpuledger.pipeline.facts.minutes import (
    MINUTE_MS,
    clip_ms,
    expand_held,
    expand_to_minutes,
    ms,
    to_time,
)

FRAGS = [f"frag_{k}" for k in FRAG_KS]
ALL = "all"


@dataclass
class Answers:
    """One schedule's answers (module docstring)."""

    policy: str
    wait: pl.DataFrame
    blocked: pl.DataFrame
    frag: pl.DataFrame
    frag_hourly: pl.DataFrame
    usage: pl.DataFrame
    lost: pl.DataFrame
    teams: pl.DataFrame


def _size(gpus: pl.Expr, fraction: pl.Expr) -> pl.Expr:
    return pl.when(fraction < 1.0).then(pl.lit("<1")).otherwise(gpus.cast(pl.String))


def _quantiles() -> list[pl.Expr]:
    w = pl.col("wait_min")
    return [pl.len().alias("attempts"),
            w.quantile(0.5, "linear").alias("p50_min"),
            w.quantile(0.9, "linear").alias("p90_min"),
            w.quantile(0.99, "linear").alias("p99_min"),
            w.mean().alias("mean_min")]


def waits(run: Run, h: History) -> pl.DataFrame:
    """Queue wait percentiles by queue, by size, by queue and size, and overall."""
    lo, hi = pl.lit(h.start).cast(TIME_DTYPE), pl.lit(h.end).cast(TIME_DTYPE)
    a = run.attempts.filter(pl.col("started_at").is_not_null() & (pl.col("started_at") >= lo)
                            & (pl.col("started_at") < hi)).with_columns(
        ((pl.col("started_at") - pl.col("queued_at")).dt.total_seconds() / 60.0)
        .alias("wait_min"),
        _size(pl.col("gpus"), pl.col("fraction")).alias("size"),
        pl.col("queue").fill_null("(none)"))
    parts = [
        a.group_by("queue").agg(_quantiles()).select(
            pl.lit("queue").alias("by"), pl.col("queue").alias("key"), pl.exclude("queue")),
        a.group_by("size").agg(_quantiles()).select(
            pl.lit("size").alias("by"), pl.col("size").alias("key"), pl.exclude("size")),
        a.group_by("queue", "size").agg(_quantiles()).select(
            pl.lit("queue, size").alias("by"),
            pl.concat_str("queue", "size", separator=", ").alias("key"),
            pl.exclude("queue", "size")),
        a.select(pl.lit(ALL).alias("by"), pl.lit(ALL).alias("key"), *_quantiles()),
    ]
    out = pl.concat([p.with_columns(pl.col("attempts").cast(pl.Int64)) for p in parts],
                    how="vertical_relaxed")
    return out.filter(pl.col("attempts") > 0).sort("by", "key")


def _sampled(frame: pl.DataFrame, h: History) -> pl.DataFrame:
    if h.step_minutes == 1:
        return frame
    minutes = h.grid.select("minute").unique()
    return frame.join(minutes, on="minute", how="semi")


def answers(run: Run, h: History) -> Answers:
    """All answers of ``run`` over the history's window and grid."""
    hours = h.step_minutes / 60.0
    keys = ["minute", "node", "gpu_index"]
    # free GPUs: a snapshot at each minute's middle (as the facts' fragmentation)
    busy = _sampled(expand_to_minutes(run.allocations, "start", "end", h.start, h.end), h)
    taken = busy.select(*keys).unique().with_columns(pl.lit(True).alias("_taken"))
    state = h.grid.join(taken, on=keys, how="left").with_columns(
        (pl.col("node_ok") & pl.col("gpu_ok") & pl.col("_taken").is_null())
        .alias("cluster_free"))
    nodes = state.group_by("minute", "pool", "card_type", "node").agg(
        pl.col("cluster_free").sum().cast(pl.Int64).alias("free"),
        pl.len().cast(pl.Int64).alias("node_gpus"), pl.col("node_ok").all())
    # how many healthy nodes have each number of free GPUs (facts.cluster.histogram)
    hist = nodes.filter(pl.col("node_ok")).group_by(
        "minute", "pool", "card_type", "node_gpus", "free").agg(
        pl.len().cast(pl.Int64).alias("nodes"))
    frag = fragmentation(hist)
    # held GPU shares: exact to the second (fraction × seconds held / 60 per minute)
    act = run.attempts.select("job_id", "attempt", "team", "activity")
    held = expand_held(clip_ms(run.allocations, "start", "end", ms(h.start), ms(h.end))).select(
        "job_id", "attempt", "node", "gpu_index", to_time(pl.col("minute_ms")).alias("minute"),
        (pl.col("fraction") * pl.col("held_ms") / MINUTE_MS).alias("fraction")).collect()
    allocs = _sampled(held, h).join(act, on=["job_id", "attempt"], how="left")
    pending = run.attempts.with_columns(
        pl.coalesce("started_at", "ended_at").alias("end"))
    pend = _sampled(expand_to_minutes(pending, "queued_at", "end", h.start, h.end), h)
    blocked = demand.blocked_jobs(pend.select(
        "minute", "job_id", "attempt", "team", "pool", "card_type",
        pl.col("gpus").fill_null(1)), hist).filter(pl.col("blocked"))
    # an allocated GPU-minute on a down node or an unhealthy GPU is unavailable, not
    # allocated (docs/metrics.md: GPU state)
    gpu_pool = h.grid.filter(~pl.col("down") & pl.col("gpu_ok")).select(*keys, "pool")
    alloc_pool = allocs.join(gpu_pool, on=keys, how="inner")
    usage = state.group_by("pool").agg(
        ((pl.col("node_ok") & pl.col("gpu_ok")).sum() * hours).alias("available_gpu_hours"),
    ).join(alloc_pool.group_by("pool").agg(
        (pl.col("fraction").sum() * hours).alias("allocated_gpu_hours"),
        ((pl.col("fraction") * pl.col("activity").fill_null(0.0)).sum() * hours)
        .alias("used_gpu_hours")), on="pool", how="left").with_columns(
        pl.col("allocated_gpu_hours", "used_gpu_hours").fill_null(0.0))
    usage = pl.concat([usage, usage.select(pl.lit(ALL).alias("pool"),
                                           pl.exclude("pool").sum())]).with_columns(
        (pl.col("allocated_gpu_hours") / pl.col("available_gpu_hours")).alias("allocation_rate")
    ).sort("pool")
    lost = run.attempts.filter(pl.col("end_event") == "preempted").group_by("team").agg(
        pl.len().cast(pl.Int64).alias("preemptions"), pl.col("lost_gpu_hours").sum())
    return Answers(
        policy=run.policy,
        wait=waits(run, h),
        blocked=blocked.group_by("pool").agg(
            (pl.col("gpus").sum() * hours).alias("blocked_gpu_hours")).sort("pool"),
        frag=frag.group_by("pool", "card_type").agg(pl.col(FRAGS).mean()).sort(
            "pool", "card_type"),
        frag_hourly=frag.group_by(pl.col("minute").dt.truncate("1h").alias("hour"), "pool",
                                  "card_type").agg(pl.col(FRAGS).mean()).sort(
            "hour", "pool", "card_type"),
        usage=usage,
        lost=lost.sort("team"),
        teams=_teams(run, h, alloc_pool, blocked, lost, hours),
    )


def _teams(run: Run, h: History, alloc_pool: pl.DataFrame, blocked: pl.DataFrame,
           lost: pl.DataFrame, hours: float) -> pl.DataFrame:
    lo, hi = pl.lit(h.start).cast(TIME_DTYPE), pl.lit(h.end).cast(TIME_DTYPE)
    started = run.attempts.filter(pl.col("started_at").is_not_null()
                                  & (pl.col("started_at") >= lo) & (pl.col("started_at") < hi))
    w = ((pl.col("started_at") - pl.col("queued_at")).dt.total_seconds() / 60.0)
    teams = pl.concat([run.attempts.select("team"), alloc_pool.select("team")]).unique()
    teams = teams.drop_nulls()
    return teams.join(started.group_by("team").agg(
        pl.len().cast(pl.Int64).alias("started"), w.mean().alias("mean_wait_min"),
        w.quantile(0.9, "linear").alias("p90_wait_min")), on="team", how="left").join(
        alloc_pool.group_by("team").agg(
            (pl.col("fraction").sum() * hours).alias("allocated_gpu_hours"),
            ((pl.col("fraction") * pl.col("activity").fill_null(0.0)).sum() * hours)
            .alias("used_gpu_hours")), on="team", how="left").join(
        lost.select("team", "lost_gpu_hours"), on="team", how="left").join(
        blocked.group_by("team").agg((pl.col("gpus").sum() * hours).alias("blocked_gpu_hours")),
        on="team", how="left").with_columns(
        pl.col("started").fill_null(0),
        pl.col("allocated_gpu_hours", "used_gpu_hours", "lost_gpu_hours",
               "blocked_gpu_hours").fill_null(0.0)).sort("team")
