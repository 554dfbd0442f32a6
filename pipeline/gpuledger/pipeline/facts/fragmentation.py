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


def fragmentation(hist: pl.DataFrame) -> pl.DataFrame:
    """frag(k) for k = 1, 2, 4, 8 and the node size, per minute, pool and card type.

    ``hist``: per minute, pool, card type, node size (``node_gpus``) and free GPUs
    (``free``), the number of schedulable, healthy ``nodes`` (``cluster.histogram``).
    Also reports the free GPUs, the largest free block, the healthy nodes, the node size
    (the largest node's GPU count) and the GPUs usable by whole-node jobs.

    ``frag_node`` uses each node's own size: a pool of 1-, 4- and 8-GPU nodes counts a
    node's free GPUs as usable by whole-node jobs only when all its GPUs are free.
    """
    free, n = pl.col("free"), pl.col("nodes")
    aggs = [
        (free * n).sum().alias("free_gpus"),
        pl.col("node_gpus").max().alias("node_size"),
        free.max().alias("largest_free_block"),
        n.sum().alias("healthy_nodes"),
    ]
    aggs += [(usable(k, free) * n).sum().alias(f"_u{k}") for k in FRAG_KS]
    aggs.append((usable(pl.col("node_gpus"), free) * n).sum().alias("_unode"))
    out = hist.group_by(["minute", "pool", "card_type"]).agg(aggs)
    f_total = pl.col("free_gpus")
    return out.with_columns(
        *[frag_ratio(pl.col(f"_u{k}"), f_total).alias(f"frag_{k}") for k in FRAG_KS],
        frag_ratio(pl.col("_unode"), f_total).alias("frag_node"),
        pl.col("_unode").alias("whole_node_free_gpus"),
    ).drop([f"_u{k}" for k in FRAG_KS] + ["_unode"])
