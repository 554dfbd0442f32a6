"""Fragmentation, pending and blocked demand, queue wait (cluster-wide facts).

Fragmentation and free capacity are by ``pool`` and physical ``card_type``; the queue
series describe jobs, so they carry ``requested_card_type`` (``any`` for a job that
asked for no card type: it counts in every card type's demand of its pool).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import polars as pl
from prometheus_client.core import HistogramMetricFamily, Metric

from gpuledger.pipeline.columns import TIME_DTYPE
from gpuledger.pipeline.exporter.families import gauge
from gpuledger.pipeline.exporter.histogram import Histogram
from gpuledger.pipeline.exporter.snapshot import QUEUE_LABELS, Snapshot

PC = ["pool", "card_type"]
FRAG_K = {"1": "frag_1", "2": "frag_2", "4": "frag_4", "8": "frag_8", "node": "frag_node",
          "demand": "frag_demand"}


def _requested(frame: pl.DataFrame) -> pl.DataFrame:
    """A job-side frame's ``card_type`` (what the jobs asked for) as ``requested_card_type``."""
    if "card_type" in frame.columns:
        return frame.rename({"card_type": "requested_card_type"})
    return frame


class DemandCollector:
    """From ``frag_minute`` and ``pending_minute`` of the latest minute, and the job book."""

    name = "demand"

    def __init__(self, queue_wait: Histogram, lock: threading.Lock) -> None:
        self.queue_wait = queue_wait
        self.lock = lock

    def collect(self, snap: Snapshot) -> Iterator[Metric]:
        frag = snap.table("frag_minute")
        if frag.is_empty():
            frag = pl.DataFrame(schema={
                "pool": pl.String, "card_type": pl.String, "free_gpus": pl.Int64,
                "largest_free_block": pl.Int64, "blocked_jobs": pl.Int64,
                "blocked_gpus": pl.Int64, **{c: pl.Float64 for c in FRAG_K.values()}})
        long = frag.select(*PC, *FRAG_K.values()).unpivot(
            index=PC, variable_name="column", value_name="ratio").with_columns(
            pl.col("column").replace_strict({v: k for k, v in FRAG_K.items()}).alias("k"))
        yield gauge("gpuledger_fragmentation_ratio",
                    "frag(k): share of free GPUs that cannot host a k-GPU single-node job "
                    "(k = 1, 2, 4, 8, node size, or demand-weighted).",
                    long, [*PC, "k"], "ratio")
        yield gauge("gpuledger_free_gpus", "Free whole GPUs on healthy, schedulable nodes.",
                    frag, PC, "free_gpus")
        yield gauge("gpuledger_largest_free_block_gpus", "The most free GPUs on any one node.",
                    frag, PC, "largest_free_block")
        yield gauge("gpuledger_blocked_demand_jobs",
                    "Pending jobs whose GPU count fits in the free GPUs but on no node.",
                    frag, PC, "blocked_jobs")
        yield gauge("gpuledger_blocked_demand_gpus", "GPUs requested by blocked pending jobs.",
                    frag, PC, "blocked_gpus")
        pend = _requested(snap.table("pending_minute"))
        if pend.is_empty():
            pend = pl.DataFrame(schema={**{c: pl.String for c in QUEUE_LABELS},
                                        **{c: pl.Int64 for c in (
                                            "pending_jobs", "pending_gpus", "blocked_jobs",
                                            "blocked_gpus")}})
        for col, doc in (("pending_jobs", "Pending jobs."),
                         ("pending_gpus", "GPUs requested by pending jobs."),
                         ("blocked_jobs", "Pending jobs blocked by fragmentation."),
                         ("blocked_gpus", "GPUs requested by pending jobs blocked by "
                          "fragmentation.")):
            yield gauge(f"gpuledger_queue_{col}", doc, pend, QUEUE_LABELS, col, any_card=True)
        yield self._oldest_pending(snap)
        yield self._histogram()

    def _oldest_pending(self, snap: Snapshot) -> Metric:
        doc = "Seconds the longest-waiting pending job has waited (event time)."
        until = snap.until
        if until is None or snap.pending.is_empty():
            return gauge("gpuledger_queue_oldest_pending_seconds", doc, pl.DataFrame(),
                         QUEUE_LABELS, "age")
        ages = _requested(snap.pending).group_by(QUEUE_LABELS).agg(
            (pl.lit(until).cast(TIME_DTYPE) - pl.col("queued_at").min())
            .dt.total_milliseconds().alias("age_ms"))
        return gauge("gpuledger_queue_oldest_pending_seconds", doc, ages, QUEUE_LABELS,
                     pl.col("age_ms") / 1000.0, any_card=True)

    def _histogram(self) -> Metric:
        """Observed with ``requested_card_type`` ``any`` for any-card jobs (snapshot)."""
        family = HistogramMetricFamily(
            "gpuledger_queue_wait_seconds",
            "Queue wait of each job attempt (start - submit or requeue), observed when it "
            "starts.", labels=QUEUE_LABELS)
        with self.lock:
            rows = self.queue_wait.rows()
        for labels, buckets, total in rows:
            family.add_metric(labels, buckets, total)
        return family
