"""Pending demand, blocked demand and demand-weighted fragmentation.

A pending job-minute is *blocked by fragmentation* when the job's GPU count fits in
the free GPUs ``F`` of its pool and card type, but on no node: a single-node job
(``g`` ≤ node size) needs a node with ``f_n ≥ g``; a multi-node job needs ``g`` GPUs
in whole free nodes. A job that names no card type is matched against all card types
of its pool (and weighs on the demand-weighted rate of each).

The demand-weighted fragmentation rate of a pool and card type weights ``frag(g)`` by
the GPUs ``g`` of its pending jobs (``k = min(g, node size)``); with nothing pending it
falls back to the sizes of the attempts started there in the day before the minute.
"""

from __future__ import annotations

import polars as pl

from gpuledger.pipeline.facts.fragmentation import frag_ratio, usable

_KEYS = ["minute", "pool", "card_type"]


def _per_size(nodes: pl.DataFrame, demand: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Join demand rows (with ``gpus``) to the matching nodes and sum per ``by``."""
    ok = nodes.filter(pl.col("node_ok"))
    matched = demand.join(
        ok.rename({"card_type": "_node_card"}), on=["minute", "pool"], how="inner"
    ).filter(pl.col("card_type").is_null() | (pl.col("card_type") == pl.col("_node_card")))
    k = pl.min_horizontal(pl.col("gpus"), pl.col("node_gpus"))
    return matched.group_by(by).agg(
        pl.col("free").sum().alias("free_gpus"),
        pl.col("free").max().alias("largest_free_block"),
        pl.col("node_gpus").max().alias("node_size"),
        usable(pl.col("node_gpus"), pl.col("free")).sum().alias("whole_node_free"),
        usable(k, pl.col("free")).sum().alias("usable_for_size"),
    )


def blocked_jobs(pending: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """Per pending job-minute: the free GPUs it could see and whether it is blocked."""
    if pending.is_empty():
        return pending.with_columns(
            pl.lit(None, pl.Int64()).alias("free_gpus"),
            pl.lit(None, pl.Int64()).alias("largest_free_block"),
            pl.lit(False).alias("blocked"),
        )
    sizes = _per_size(nodes, pending.select(["job_id", "attempt", *_KEYS, "gpus"]),
                      ["job_id", "attempt", "minute"])
    out = pending.join(sizes, on=["job_id", "attempt", "minute"], how="left")
    g = pl.col("gpus")
    fits = pl.when(g <= pl.col("node_size")).then(pl.col("largest_free_block") >= g).otherwise(
        pl.col("whole_node_free") >= g
    )
    return out.with_columns(
        ((g <= pl.col("free_gpus")) & ~fits).fill_null(False).alias("blocked")
    ).select([*pending.columns, "free_gpus", "largest_free_block", "blocked"])


def demand_weighted(
    pending: pl.DataFrame, started_sizes: pl.DataFrame, nodes: pl.DataFrame,
    minutes: pl.Series,
) -> pl.DataFrame:
    """Demand-weighted frag per minute, pool and card type, with its weight source."""
    schema = {"minute": minutes.dtype, "pool": pl.String(), "card_type": pl.String(),
              "frag_demand": pl.Float64(), "demand_source": pl.String()}
    parts: list[pl.DataFrame] = []
    cards = nodes.select("minute", "pool", "card_type").unique()
    typed = any_card_to_each(pending.select([*_KEYS, "gpus"]), cards)
    if not typed.is_empty():
        per = _per_size(nodes, typed.select([*_KEYS, "gpus"]).unique(),
                        [*_KEYS, "gpus"])
        weights = typed.group_by([*_KEYS, "gpus"]).agg(pl.len().alias("jobs"))
        parts.append(_weighted(per, weights, "pending"))
    if not started_sizes.is_empty():
        # per minute: the attempts started in the day before the minute's middle
        mid = pl.col("minute") + pl.duration(seconds=30)
        recent = started_sizes.join(pl.DataFrame({"minute": minutes}), how="cross").filter(
            (pl.col("started_at") <= mid) & (pl.col("started_at") > mid - pl.duration(days=1))
        ).drop("started_at")
        weights = any_card_to_each(recent, cards).group_by([*_KEYS, "gpus"]).agg(
            pl.len().alias("jobs"))
        per = _per_size(nodes, weights.select([*_KEYS, "gpus"]), [*_KEYS, "gpus"])
        parts.append(_weighted(per, weights, "started_1d"))
    if not parts:
        return pl.DataFrame(schema=schema)
    both = pl.concat(parts)
    # pending-based wins where both exist
    return (
        both.sort([*_KEYS, "demand_source"], descending=[False, False, False, False])
        .group_by(_KEYS, maintain_order=True).first()
        .select(list(schema))
    )


def any_card_to_each(demand: pl.DataFrame, cards: pl.DataFrame) -> pl.DataFrame:
    """Demand that names no card type counts towards every card type of its pool."""
    named = demand.filter(pl.col("card_type").is_not_null())
    anyc = demand.filter(pl.col("card_type").is_null()).drop("card_type").join(
        cards, on=["minute", "pool"], how="inner")
    return pl.concat([named, anyc.select(named.columns)])


def _weighted(per: pl.DataFrame, weights: pl.DataFrame, source: str) -> pl.DataFrame:
    joined = per.join(weights, on=[*_KEYS, "gpus"], how="inner")
    w = pl.col("gpus") * pl.col("jobs")
    return (
        joined.with_columns(frag_ratio(pl.col("usable_for_size"), pl.col("free_gpus"))
                            .alias("_frag"))
        .group_by(_KEYS)
        .agg(((pl.col("_frag") * w).sum() / w.sum()).alias("frag_demand"))
        .with_columns(pl.lit(source).alias("demand_source"))
    )
