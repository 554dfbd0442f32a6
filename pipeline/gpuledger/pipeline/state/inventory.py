"""Node inventory over time: which GPUs exist, where, and whether they can be used.

Inventory records are state, not deltas: the newest record of a node (by event time)
describes it from that time on. :class:`InventoryBook` keeps each node's history back
to the newest record at or before the oldest open minute, so any open minute can be
looked up *as of* its time.
"""

from __future__ import annotations

from datetime import datetime

import polars as pl

from gpuledger.pipeline.columns import TIME_DTYPE

INVENTORY_STATE_SCHEMA = pl.Schema(
    {
        "node": pl.String(),
        "time": TIME_DTYPE,
        "pool": pl.String(),
        "card_type": pl.String(),
        "gpu_count": pl.Int64(),
        "gpu_mem_mib": pl.Float64(),
        "schedulable": pl.Boolean(),
        "health": pl.String(),
        "unhealthy_gpus": pl.List(pl.Int64()),
    }
)


class InventoryBook:
    """The history of node records that open minutes may still need."""

    def __init__(self) -> None:
        self.records = pl.DataFrame(schema=INVENTORY_STATE_SCHEMA)

    def apply(self, inventory: pl.DataFrame) -> None:
        """Add validated inventory records; a repeated (node, time) keeps the last."""
        if inventory.is_empty():
            return
        new = inventory.select(INVENTORY_STATE_SCHEMA.names())
        self.records = (
            pl.concat([self.records, new])
            .unique(subset=["node", "time"], keep="last", maintain_order=True)
            .sort(["node", "time"])
        )

    def gpus_at(self, minutes: pl.Series) -> pl.DataFrame:
        """One row per (minute, node, gpu_index) for the nodes known at each minute.

        A node is looked up as of the minute's middle (``minute + 30 s``), like
        allocations. Columns: minute, node, gpu_index, pool, card_type, gpu_mem_mib,
        schedulable, health, gpu_unhealthy.
        """
        if self.records.is_empty() or minutes.is_empty():
            return pl.DataFrame(
                schema={"minute": TIME_DTYPE, "node": pl.String(), "gpu_index": pl.Int64(),
                        "pool": pl.String(), "card_type": pl.String(), "gpu_mem_mib": pl.Float64(),
                        "schedulable": pl.Boolean(), "health": pl.String(),
                        "gpu_unhealthy": pl.Boolean()}
            )
        nodes = self.records.select("node").unique()
        grid = (
            nodes.join(pl.DataFrame({"minute": minutes.cast(TIME_DTYPE)}), how="cross")
            .with_columns((pl.col("minute") + pl.duration(seconds=30)).alias("_mid"))
            .sort(["node", "_mid"])
        )
        asof = grid.join_asof(
            self.records.rename({"time": "_mid"}).sort(["node", "_mid"]),
            on="_mid", by="node", strategy="backward", check_sortedness=False,
        ).filter(pl.col("gpu_count").is_not_null())
        return (
            asof.with_columns(pl.int_ranges(0, pl.col("gpu_count")).alias("gpu_index"))
            .explode("gpu_index")
            .filter(pl.col("gpu_index").is_not_null())
            .with_columns(
                pl.col("unhealthy_gpus").fill_null(pl.lit([], pl.List(pl.Int64())))
                .list.contains(pl.col("gpu_index")).alias("gpu_unhealthy")
            )
            .select("minute", "node", "gpu_index", "pool", "card_type", "gpu_mem_mib",
                    "schedulable", "health", "gpu_unhealthy")
        )

    def prune(self, closed_until: datetime) -> None:
        """Drop records superseded before ``closed_until`` (keep one per node)."""
        if self.records.is_empty():
            return
        cutoff = pl.lit(closed_until).cast(TIME_DTYPE)
        older = self.records.filter(pl.col("time") <= cutoff)
        newest_old = older.group_by("node", maintain_order=True).last()
        self.records = pl.concat(
            [newest_old.select(INVENTORY_STATE_SCHEMA.names()),
             self.records.filter(pl.col("time") > cutoff)]
        ).sort(["node", "time"])
