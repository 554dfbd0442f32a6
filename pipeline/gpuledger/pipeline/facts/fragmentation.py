"""Fragmentation: the share of free GPUs that cannot host a k-GPU single-node job.

For each pool and card type, each minute, with ``f_n`` free whole GPUs on each healthy,
schedulable node and ``F = Σ f_n``::

    frag(k) = 1 − Σ_n k·⌊f_n / k⌋ / F        (0 when F = 0)

Worked example: free GPUs per node (3, 1, 4, 0) → F = 8; k = 2: 2·1 + 0 + 2·2 = 6 usable,
frag(2) = 1 − 6/8 = 0.25; k = 4: 0 + 0 + 4 = 4, frag(4) = 0.5; k = 8: frag(8) = 1.
A GPU with any allocation (also a fraction of it: MIG or shared) is not free. This is
the integer form of the measure of Weng et al., "Beware of Fragmentation" (ATC '23).

Cluster-wide facts: computed from scheduler and inventory state only (never from
telemetry), so every processor instance would compute the same numbers; only the
instance with ``cluster_facts`` on writes them.
"""

from __future__ import annotations

import polars as pl

from gpuledger.pipeline.facts.minutes import MINUTE_MS

FRAG_KS = (1, 2, 4, 8)


def usable(k: pl.Expr | int, free: pl.Expr) -> pl.Expr:
    """GPUs of a node with ``free`` free GPUs that k-GPU jobs can use: k·⌊f/k⌋."""
    k_expr = k if isinstance(k, pl.Expr) else pl.lit(k)
    return (free // k_expr) * k_expr


def frag_ratio(usable_sum: pl.Expr, free_total: pl.Expr) -> pl.Expr:
    """1 − usable/F, 0 when F = 0."""
    return (
        pl.when(free_total > 0)
        .then(1.0 - usable_sum.cast(pl.Float64) / free_total.cast(pl.Float64))
        .otherwise(0.0)
    )


def free_per_node(node_runs: pl.DataFrame, busy: pl.DataFrame) -> pl.DataFrame:
    """Free whole GPUs per (minute, pool, card_type, node).

    ``node_runs``: inventory runs clipped to the step (``state/inventory.py``);
    ``busy``: one row per (minute, node, gpu_index) with an allocation at the minute's
    middle (any fraction). Free = the node's healthy GPUs with no allocation; columns
    ``free``, ``node_gpus`` (the node's GPU count) and ``node_ok`` (schedulable, not down).
    One row per node-minute, not per GPU-minute.
    """
    grid = (
        node_runs.lazy()
        .with_columns(pl.int_ranges(pl.col("from_ms"), pl.col("to_ms"), MINUTE_MS)
                      .alias("minute_ms"))
        .explode("minute_ms")
        .select(
            "minute_ms", "node", "pool", "card_type",
            pl.col("gpu_count").alias("node_gpus"),
            (pl.col("schedulable") & (pl.col("health") != "down")).fill_null(False)
            .alias("node_ok"),
            pl.col("unhealthy_gpus").fill_null(pl.lit([], pl.List(pl.Int64()))).alias("_bad"),
        )
    )
    taken = (
        busy.lazy()
        .select(pl.col("minute").cast(pl.Int64).alias("minute_ms"), "node", "gpu_index")
        .unique()
        .join(grid.select("minute_ms", "node", "node_gpus", "_bad"),
              on=["minute_ms", "node"], how="inner")
        .filter((pl.col("gpu_index") < pl.col("node_gpus"))
                & ~pl.col("_bad").list.contains(pl.col("gpu_index")))
        .group_by(["minute_ms", "node"])
        .agg(pl.len().cast(pl.Int64).alias("_busy"))
    )
    healthy = pl.col("node_gpus") - pl.col("_bad").list.unique().list.len().cast(pl.Int64)
    return (
        grid.join(taken, on=["minute_ms", "node"], how="left")
        .with_columns(
            (healthy - pl.col("_busy").fill_null(0)).clip(0, None).alias("free"),
            pl.col("minute_ms").cast(pl.Datetime("ms")).dt.replace_time_zone("UTC")
            .alias("minute"),
        )
        .select("minute", "pool", "card_type", "node", "free", "node_gpus", "node_ok")
        .collect()
    )


def fragmentation(nodes: pl.DataFrame) -> pl.DataFrame:
    """frag(k) for k = 1, 2, 4, 8 and the node size, per minute, pool and card type.

    ``nodes``: output of :func:`node_free_gpus`. Also reports capacity, free GPUs,
    the largest free block, and the GPUs usable by whole-node jobs.
    """
    ok = nodes.filter(pl.col("node_ok"))
    free = pl.col("free")
    aggs = [
        free.sum().alias("free_gpus"),
        pl.col("node_gpus").max().alias("node_size"),
        free.max().alias("largest_free_block"),
        pl.len().alias("healthy_nodes"),
    ]
    aggs += [usable(k, free).sum().alias(f"_u{k}") for k in FRAG_KS]
    aggs.append(usable(pl.col("node_gpus"), free).sum().alias("_unode"))
    out = ok.group_by(["minute", "pool", "card_type"]).agg(aggs)
    f_total = pl.col("free_gpus")
    return out.with_columns(
        *[frag_ratio(pl.col(f"_u{k}"), f_total).alias(f"frag_{k}") for k in FRAG_KS],
        frag_ratio(pl.col("_unode"), f_total).alias("frag_node"),
        pl.col("_unode").alias("whole_node_free_gpus"),
    ).drop([f"_u{k}" for k in FRAG_KS] + ["_unode"])
