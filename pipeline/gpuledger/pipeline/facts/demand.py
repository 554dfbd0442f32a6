"""Pending demand, blocked demand and demand-weighted fragmentation.

A pending job-minute is *blocked by fragmentation* when the job's GPU count fits in
the free GPUs ``F`` of its pool and card type, but on no node: a single-node job
(``g`` ≤ node size) needs a node with ``f_n ≥ g``; a multi-node job needs ``g`` GPUs
in whole free nodes. A job that names no card type is matched against all card types
of its pool (and weighs on the demand-weighted rate of each).

The demand-weighted fragmentation rate of a pool and card type weights ``frag(g)`` by
the GPUs ``g`` of its pending jobs (``k = min(g, node size)``); with nothing pending it
falls back to the sizes of the attempts started there in the day before the minute.

Everything reads the per-minute histogram of free GPUs per node (``cluster.histogram``),
never a row per node or GPU.
"""

from __future__ import annotations

from datetime import datetime

import polars as pl

from gpuledger.pipeline.facts.fragmentation import frag_ratio, usable
from gpuledger.pipeline.facts.minutes import minute_range

_KEYS = ["minute", "pool", "card_type"]


def _capacity(hist: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Free GPUs, largest free block, node size and whole-node free GPUs per ``by``."""
    free, n = pl.col("free"), pl.col("nodes")
    return hist.group_by(by).agg(
        (free * n).sum().alias("free_gpus"),
        free.max().alias("largest_free_block"),
        pl.col("node_gpus").max().alias("node_size"),
        (usable(pl.col("node_gpus"), free) * n).sum().alias("whole_node_free"),
    )


def blocked_jobs(pending: pl.DataFrame, hist: pl.DataFrame) -> pl.DataFrame:
    """Per row of pending demand (a job and minute, or a cohort of alike jobs and a
    minute): the free GPUs it could see and whether it is blocked."""
    if pending.is_empty():
        return pending.with_columns(
            pl.lit(None, pl.Int64()).alias("free_gpus"),
            pl.lit(None, pl.Int64()).alias("largest_free_block"),
            pl.lit(False).alias("blocked"),
        )
    cols = ["free_gpus", "largest_free_block", "node_size", "whole_node_free"]
    typed = pending.filter(pl.col("card_type").is_not_null()).join(
        _capacity(hist, _KEYS), on=_KEYS, how="left")
    anyc = pending.filter(pl.col("card_type").is_null()).join(
        _capacity(hist, ["minute", "pool"]), on=["minute", "pool"], how="left")
    out = pl.concat([typed, anyc.select(typed.columns)]).with_columns(
        pl.col(c).cast(pl.Int64) for c in cols)
    g = pl.col("gpus")
    fits = pl.when(g <= pl.col("node_size")).then(pl.col("largest_free_block") >= g).otherwise(
        pl.col("whole_node_free") >= g
    )
    return out.with_columns(
        ((g <= pl.col("free_gpus")) & ~fits).fill_null(False).alias("blocked")
    ).select([*pending.columns, "free_gpus", "largest_free_block", "blocked"])


def _frag_for_sizes(hist: pl.DataFrame, weights: pl.DataFrame, source: str) -> pl.DataFrame:
    """frag(g) per minute, pool, card type and size g, weighted by g × jobs (jobs of no
    GPU weigh nothing: with only those, the weighted mean was 0 / 0, NaN)."""
    weights = weights.filter(pl.col("gpus") > 0)
    sizes = weights.select([*_KEYS, "gpus"]).unique()
    k = pl.min_horizontal(pl.col("gpus"), pl.col("node_gpus"))
    per = hist.join(sizes, on=_KEYS, how="inner").group_by([*_KEYS, "gpus"]).agg(
        (usable(k, pl.col("free")) * pl.col("nodes")).sum().alias("usable_for_size"),
        (pl.col("free") * pl.col("nodes")).sum().alias("free_gpus"),
    )
    w = pl.col("gpus") * pl.col("jobs")
    return (
        per.join(weights, on=[*_KEYS, "gpus"], how="inner")
        .with_columns(frag_ratio(pl.col("usable_for_size"), pl.col("free_gpus")).alias("_frag"))
        .group_by(_KEYS)
        .agg(((pl.col("_frag") * w).sum() / w.sum()).alias("frag_demand"))
        .with_columns(pl.lit(source).alias("demand_source"))
    )


def _started_weights(starts: pl.DataFrame, cards: pl.DataFrame, a: datetime,
                     b: datetime) -> pl.DataFrame:
    """Per minute, pool, card type and size: attempts started in the day before the
    minute's middle (``t ≤ mid`` and ``t > mid − 1 day``), by cumulative counts."""
    typed = any_card_to_each(starts.rename({"started_at": "t"}), cards, by_minute=False)
    if typed.is_empty():
        return pl.DataFrame(schema={**dict.fromkeys(_KEYS), "gpus": pl.Int64, "jobs": pl.UInt32})
    keys = ["pool", "card_type", "gpus"]
    cum = typed.sort("t").with_columns(pl.int_range(1, pl.len() + 1).over(keys).alias("n"))
    grid = typed.select(keys).unique().join(pl.DataFrame({"minute": minute_range(a, b)}),
                                            how="cross").with_columns(
        (pl.col("minute") + pl.duration(seconds=30)).alias("mid"))

    def count_at(at: pl.Expr) -> pl.DataFrame:
        probe = grid.with_columns(at.alias("t")).sort("t")
        return probe.join_asof(cum.select(*keys, "t", "n").sort("t"), on="t", by=keys,
                               strategy="backward", check_sortedness=False
                               ).with_columns(pl.col("n").fill_null(0))

    now = count_at(pl.col("mid"))
    before = count_at(pl.col("mid") - pl.duration(days=1)).select(
        *keys, "minute", pl.col("n").alias("n0"))
    return now.join(before, on=[*keys, "minute"]).select(
        "minute", *keys, (pl.col("n") - pl.col("n0")).cast(pl.UInt32).alias("jobs")
    ).filter(pl.col("jobs") > 0)


def demand_weighted(pending: pl.DataFrame, started_sizes: pl.DataFrame, hist: pl.DataFrame,
                    a: datetime, b: datetime) -> pl.DataFrame:
    """Demand-weighted frag per minute, pool and card type, with its weight source.
    ``pending``: pending jobs per minute, pool, card type and size (``jobs``)."""
    schema = {"minute": pl.Datetime("ms", "UTC"), "pool": pl.String(), "card_type": pl.String(),
              "frag_demand": pl.Float64(), "demand_source": pl.String()}
    parts: list[pl.DataFrame] = []
    cards = hist.select("minute", "pool", "card_type").unique()
    typed = any_card_to_each(pending.select([*_KEYS, "gpus", "jobs"]), cards)
    if not typed.is_empty():
        weights = typed.group_by([*_KEYS, "gpus"]).agg(pl.col("jobs").sum())
        parts.append(_frag_for_sizes(hist, weights, "pending"))
    if not started_sizes.is_empty():
        weights = _started_weights(started_sizes, cards.select("pool", "card_type").unique(),
                                   a, b)
        if not weights.is_empty():
            parts.append(_frag_for_sizes(hist, weights, "started_1d"))
    if not parts:
        return pl.DataFrame(schema=schema)
    both = pl.concat(parts)
    # pending-based wins where both exist
    return (
        both.sort([*_KEYS, "demand_source"])
        .group_by(_KEYS, maintain_order=True).first()
        .select(list(schema))
    )


def any_card_to_each(demand: pl.DataFrame, cards: pl.DataFrame,
                     by_minute: bool = True) -> pl.DataFrame:
    """Demand that names no card type counts towards every card type of its pool (at
    that minute, or over the step when ``by_minute`` is off)."""
    on = ["minute", "pool"] if by_minute else ["pool"]
    named = demand.filter(pl.col("card_type").is_not_null())
    anyc = demand.filter(pl.col("card_type").is_null()).drop("card_type").join(
        cards.select([*on, "card_type"]).unique(), on=on, how="inner")
    return pl.concat([named, anyc.select(named.columns)])

