"""The answers of a schedule (replayed, or as run), with the warehouse's own definitions.

Columnar and vectorised. Held GPU shares are exact to the second (as
:func:`facts.minutes.expand_held` counts them), less the minutes a GPU was down or
unhealthy, whatever the step. Free GPUs and pending jobs are snapshots at a minute's
middle (:func:`facts.minutes.expand_to_minutes`) on the history's grid (every ``step``
minutes from the window start, each sample standing for the minutes up to the next),
and frag(k) and blocked demand come from the facts' own functions
(:func:`facts.fragmentation.fragmentation`, :func:`facts.demand.blocked_jobs`) over the
same free-GPU histogram, so an answer means here what it means in the facts
(``docs/metrics.md``). The schedule as run, with ``from_facts``, takes frag(k) and blocked
demand from the facts themselves (``frag_minute``, ``blocked_minute``): the observed
column does not depend on the step.

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

from gpuledger.pipeline import engines
from gpuledger.pipeline.advisor.history import History
from gpuledger.pipeline.advisor.replay import Run
from gpuledger.pipeline.columns import TIME_DTYPE
from gpuledger.pipeline.facts import demand
from gpuledger.pipeline.facts.fragmentation import FRAG_KS, fragmentation
from gpuledger.pipeline.facts.minutes import HOUR_MS, clip_ms, minute_rows, ms

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


def _sampled(intervals: pl.DataFrame, start: str, end: str, h: History) -> pl.LazyFrame:
    """The plan of a row per interval and grid minute whose middle it covers
    (``expand_to_minutes`` on the grid's minutes, and only those the grid holds)."""
    rows = minute_rows(intervals, start, end, h.start, h.end, h.step_minutes)
    if h.step_minutes == 1:
        return rows
    return rows.join(h.grid.lazy().select("minute").unique(), on="minute", how="semi")


def _sample_hours(h: History) -> pl.Expr:
    """The hours a grid sample at ``minute`` stands for: ``step`` minutes, the last
    sample the minutes left in the window."""
    left = (pl.lit(h.end).cast(TIME_DTYPE) - pl.col("minute")).dt.total_minutes()
    return pl.min_horizontal(pl.lit(h.step_minutes, pl.Int64), left) / 60.0


def _weighted_means(frame: pl.DataFrame, by: list[pl.Expr | str]) -> pl.DataFrame:
    """Mean frag(k) per ``by`` of sampled rows, each weighted by the hours it stands for
    (``_w``; the plain mean at step 1); null where no sample has a value."""
    def mean(k: str) -> pl.Expr:
        weight = pl.when(pl.col(k).is_not_null()).then(pl.col("_w")).otherwise(0.0).sum()
        return pl.when(weight > 0).then((pl.col(k) * pl.col("_w")).sum() / weight).alias(k)
    return frame.group_by(by).agg(mean(k) for k in FRAGS)


def held_hours(allocations: pl.DataFrame, h: History) -> pl.DataFrame:
    """Per allocation (``job_id``, ``attempt``, ``node``, ``gpu_index``): ``gpu_hours``, its
    GPU share × the time it held in the window, less the minutes the GPU was down or
    unhealthy (``History.excluded``; docs/metrics.md: an allocated minute on a down node or
    an unhealthy GPU is unavailable, not allocated), with the node's ``pool``. Exact to the
    second, from the intervals: no minute is sampled."""
    lo, hi = ms(h.start), ms(h.end)
    clipped = clip_ms(allocations.with_row_index("_row"), "start", "end", lo, hi).collect()
    ex = h.excluded.select("node", "gpu_index", pl.col("start").cast(pl.Int64).alias("_xs"),
                           pl.col("end").cast(pl.Int64).alias("_xe"))
    overlap = clipped.select("_row", "node", "gpu_index", "s_ms", "e_ms").join(
        ex, on=["node", "gpu_index"], how="inner").select(
        "_row", (pl.min_horizontal("e_ms", "_xe") - pl.max_horizontal("s_ms", "_xs"))
        .clip(lower_bound=0).alias("_out")).group_by("_row").agg(pl.col("_out").sum())
    pools = h.nodes.select("node", "pool")
    return clipped.join(overlap, on="_row", how="left").join(pools, on="node", how="inner").select(
        "job_id", "attempt", "node", "gpu_index", "pool",
        (pl.col("fraction") * (pl.col("e_ms") - pl.col("s_ms") - pl.col("_out").fill_null(0))
         / HOUR_MS).alias("gpu_hours"))


def answers(run: Run, h: History, from_facts: bool = False) -> Answers:
    """All answers of ``run`` over the history's window and grid; ``from_facts`` (the
    schedule as run): frag(k) and blocked demand as the facts recorded them."""
    keys = ["minute", "node", "gpu_index"]
    # free GPUs: a snapshot at each minute's middle (as the facts' fragmentation)
    # one streaming plan: the held GPUs' sampled minutes (5.3 M for 2,048 GPUs over 30
    # days) and the grid joined whole (6 M GPU-minutes of the openb trace) were held and
    # copied with their names, 1.1 to 2.2 GB more at the peak
    held = run.allocations.select("node", "gpu_index", "start", "end")
    taken = _sampled(held, "start", "end", h).select(*keys).unique().with_columns(
        pl.lit(True).alias("_taken"))
    nodes = h.grid.lazy().join(taken, on=keys, how="left").with_columns(
        (pl.col("node_ok") & pl.col("gpu_ok") & pl.col("_taken").is_null())
        .alias("cluster_free")).group_by("minute", "pool", "card_type", "node").agg(
        pl.col("cluster_free").sum().cast(pl.Int64).alias("free"),
        pl.len().cast(pl.Int64).alias("node_gpus"), pl.col("node_ok").all()
    ).collect(engine="streaming")
    # how many healthy nodes have each number of free GPUs (facts.cluster.histogram)
    hist = nodes.filter(pl.col("node_ok")).group_by(
        "minute", "pool", "card_type", "node_gpus", "free").agg(
        pl.len().cast(pl.Int64).alias("nodes"))
    # held GPU shares: exact to the second, every minute
    act = run.attempts.select("job_id", "attempt", "team", "activity")
    alloc_pool = held_hours(run.allocations, h).join(act, on=["job_id", "attempt"], how="left")
    if from_facts:
        blocked = h.blocked_facts
        frag_hourly = _facts_frag(h)
        frag_mean = _facts_frag_mean(h)
    else:
        pending = run.attempts.with_columns(
            pl.coalesce("started_at", "ended_at").alias("end"))
        pend = engines.step_frame(_sampled(pending, "queued_at", "end", h))
        blocked = demand.blocked_jobs(pend.select(
            "minute", "job_id", "attempt", "team", "pool", "card_type",
            pl.col("gpus").fill_null(1)), hist).filter(pl.col("blocked")).select(
            "pool", "team", (pl.col("gpus") * _sample_hours(h)).alias("blocked_gpu_hours"))
        sampled = fragmentation(hist).with_columns(_sample_hours(h).alias("_w"))
        frag_mean = _weighted_means(sampled, ["pool", "card_type"])
        frag_hourly = _weighted_means(
            sampled, [pl.col("minute").dt.truncate("1h").alias("hour"), "pool", "card_type"])
    usage = h.available.join(alloc_pool.group_by("pool").agg(
        pl.col("gpu_hours").sum().alias("allocated_gpu_hours"),
        (pl.col("gpu_hours") * pl.col("activity").fill_null(0.0)).sum()
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
        blocked=blocked.group_by("pool").agg(pl.col("blocked_gpu_hours").sum()).sort("pool"),
        frag=frag_mean.sort("pool", "card_type"),
        frag_hourly=frag_hourly.sort("hour", "pool", "card_type"),
        usage=usage,
        lost=lost.sort("team"),
        teams=_teams(run, h, alloc_pool, blocked, lost),
    )


def _facts_frag(h: History) -> pl.DataFrame:
    """Mean frag(k) per hour, pool and card type as ``frag_minute`` recorded them."""
    f = h.frag_facts
    return f.select("hour", "pool", "card_type", *[
        pl.when(pl.col(f"{k}_n") > 0).then(pl.col(f"{k}_sum") / pl.col(f"{k}_n")).alias(k)
        for k in FRAGS])


def _facts_frag_mean(h: History) -> pl.DataFrame:
    """Mean frag(k) per pool and card type as ``frag_minute`` recorded them."""
    f = h.frag_facts.group_by("pool", "card_type").agg(pl.exclude("hour").sum())
    return f.select("pool", "card_type", *[
        pl.when(pl.col(f"{k}_n") > 0).then(pl.col(f"{k}_sum") / pl.col(f"{k}_n")).alias(k)
        for k in FRAGS])


def _teams(run: Run, h: History, alloc_pool: pl.DataFrame, blocked: pl.DataFrame,
           lost: pl.DataFrame) -> pl.DataFrame:
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
            pl.col("gpu_hours").sum().alias("allocated_gpu_hours"),
            (pl.col("gpu_hours") * pl.col("activity").fill_null(0.0)).sum()
            .alias("used_gpu_hours")), on="team", how="left").join(
        lost.select("team", "lost_gpu_hours"), on="team", how="left").join(
        blocked.group_by("team").agg(pl.col("blocked_gpu_hours").sum()),
        on="team", how="left").with_columns(
        pl.col("started").fill_null(0),
        pl.col("allocated_gpu_hours", "used_gpu_hours", "lost_gpu_hours",
               "blocked_gpu_hours").fill_null(0.0)).sort("team")
