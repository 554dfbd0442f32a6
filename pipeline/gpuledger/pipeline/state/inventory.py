"""Node inventory over time: which GPUs exist, where, and whether they can be used.

Inventory records are state, not deltas: the newest record of a node describes it from
then on. A record takes effect at the first minute whose middle is at or after its time
(the snapshot rule of ``facts/minutes.py``), so a node's history is a sequence of
minute-aligned *runs*, each with one record's attributes. A node's first record also
covers the minute it was sent in (an agent sends its inventory as it starts, with its
first samples): telemetry of a node from before any record of it has no GPU to land on
and is rejected (``no inventory``). :class:`InventoryBook` keeps
each node's records back to the newest one in effect at the oldest minute any open
window (or a partition handed over, see ``processor.py``) may still need.
"""

from __future__ import annotations

import polars as pl

from gpuledger.pipeline.columns import TIME_DTYPE
from gpuledger.pipeline.facts.minutes import HALF_MINUTE_MS, ceil_minute_ms, floor_minute_ms

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
RUN_COLUMNS = ["node", "from_ms", "to_ms", "pool", "card_type", "gpu_count", "gpu_mem_mib",
               "schedulable", "health", "unhealthy_gpus"]


def _effective_ms() -> pl.Expr:
    """The first minute (ms) a record describes: the first whose middle is at or after
    its time, or for a node's first record the minute it was sent in."""
    t = pl.col("time").cast(pl.Int64)
    return pl.when(t == t.min().over("node")).then(floor_minute_ms(t)).otherwise(
        ceil_minute_ms(t - HALF_MINUTE_MS))


class InventoryBook:
    """The history of node records that open minutes may still need."""

    def __init__(self) -> None:
        self.records = pl.DataFrame(schema=INVENTORY_STATE_SCHEMA)
        self._runs: pl.DataFrame | None = None

    def apply(self, inventory: pl.DataFrame) -> None:
        """Add validated inventory records; a repeated (node, time) keeps the last."""
        if inventory.is_empty():
            return
        new = inventory.select(INVENTORY_STATE_SCHEMA.names())
        self.records = (
            pl.concat([self.records, new])
            .unique(subset=["node", "time"], keep="last", maintain_order=True)
            .sort(["node", "time"], maintain_order=True)
        )
        self._runs = None

    def all_runs(self) -> pl.DataFrame:
        """Every node's runs ``[from_ms, to_ms)`` (the last one open: ``to_ms`` null).

        Two records that take effect at the same minute: the later one wins."""
        if self._runs is None:
            self._runs = (
                self.records.with_columns(_effective_ms().alias("from_ms"))
                .unique(subset=["node", "from_ms"], keep="last", maintain_order=True)
                .with_columns(pl.col("from_ms").shift(-1).over("node").alias("to_ms"))
                .select(RUN_COLUMNS)
            )
        return self._runs

    def runs(self, lo_ms: int, hi_ms: int) -> pl.DataFrame:
        """The runs overlapping ``[lo_ms, hi_ms)``, clipped to it."""
        runs = self.all_runs()
        if runs.is_empty():
            return runs
        return runs.filter(
            (pl.col("from_ms") < hi_ms) & (pl.col("to_ms").is_null() | (pl.col("to_ms") > lo_ms))
        ).with_columns(
            pl.max_horizontal(pl.col("from_ms"), pl.lit(lo_ms)).alias("from_ms"),
            pl.min_horizontal(pl.col("to_ms").fill_null(hi_ms), pl.lit(hi_ms)).alias("to_ms"),
        )

    def node_memory(self) -> pl.DataFrame:
        """Each node's card memory per GPU (its newest record)."""
        return self.records.group_by("node").agg(pl.col("gpu_mem_mib").last())

    def prune(self, before_ms: int) -> None:
        """Forget records whose run ended before ``before_ms`` (each node keeps the one in
        effect then)."""
        if self.records.is_empty():
            return
        runs = self.all_runs()
        keep = runs.filter(pl.col("to_ms").is_null() | (pl.col("to_ms") > before_ms)).select(
            "node", "from_ms")
        if keep.height == runs.height:
            return
        self.records = self.records.with_columns(_effective_ms().alias("from_ms")).join(
            keep, on=["node", "from_ms"], how="semi").drop("from_ms")
        self._runs = None

    def merge(self, records: pl.DataFrame) -> None:
        """Add another book's records (a partition handed over with its history)."""
        self.apply(records)
