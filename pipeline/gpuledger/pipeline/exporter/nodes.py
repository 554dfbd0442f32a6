"""Per-node gauges: health and how long since each node's agent last sent telemetry."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl
from prometheus_client.core import Metric

from gpuledger.pipeline.columns import TIME_DTYPE
from gpuledger.pipeline.exporter.families import gauge
from gpuledger.pipeline.exporter.snapshot import Snapshot

NODE_LABELS = ["node", "pool", "card_type"]


class NodeCollector:
    """From the latest minute's GPU rows and the nodes' last minutes with telemetry."""

    name = "nodes"

    def collect(self, snap: Snapshot) -> Iterator[Metric]:
        gpu = snap.table("gpu_minute")
        if gpu.is_empty() or snap.until is None:
            nodes = pl.DataFrame(schema={"node": pl.String, "pool": pl.String,
                                         "card_type": pl.String, "healthy": pl.Float64,
                                         "age_s": pl.Float64})
        else:
            until = pl.lit(snap.until).cast(TIME_DTYPE)
            nodes = gpu.group_by("node").agg(
                pl.col("pool").first(), pl.col("card_type").drop_nulls().first(),
                (pl.col("schedulable").all() & (pl.col("health") != "down").fill_null(True)
                 .all()).cast(pl.Float64).alias("healthy"),
            ).join(snap.node_seen, on="node", how="left").with_columns(
                ((until - pl.col("last_seen")).dt.total_milliseconds() / 1000.0 - 60.0)
                .alias("age_s"))
        yield gauge("gpuledger_node_healthy",
                    "1 when the node is schedulable and not down (inventory), else 0.",
                    nodes, NODE_LABELS, "healthy")
        yield gauge("gpuledger_node_telemetry_age_seconds",
                    "Seconds from the end of the node's last minute with telemetry to the end "
                    "of the latest closed minute (absent: never heard from).",
                    nodes, NODE_LABELS, "age_s")
