"""Per-job gauges: running jobs and blocked pending jobs only.

A job's series exist while it runs (or, for ``gpuledger_job_blocked_gpus``, while it
is pending and blocked by fragmentation) in the latest closed minute, and are gone from
the next scrape after it ends: label cardinality is bounded by the running jobs (and
their GPUs); the full history lives in the facts.

Job series carry the card type the job asked for as ``requested_card_type`` (``any``
when any card of its pool will do); per-GPU series also carry ``card_type``, the
physical card of that GPU, as the fleet series do.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl
from prometheus_client.core import Metric

from gpuledger.pipeline.columns import TIME_DTYPE
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.exporter.families import ANY_CARD, MIB, gauge
from gpuledger.pipeline.exporter.snapshot import Snapshot
from gpuledger.pipeline.facts.job_usage import ACC_SCHEMA, attempt_usage

JOB_LABELS = ["job_id", "attempt", "team", "queue", "pool", "requested_card_type", "job_type"]
GPU_LABELS = ["job_id", "attempt", "team", "pool", "requested_card_type", "card_type", "node",
              "gpu"]
BLOCKED_LABELS = ["job_id", "attempt", "team", "queue", "pool", "requested_card_type"]
SECONDS_PER_HOUR = 3600.0


class JobCollector:
    """From the allocations of the latest minute, its GPU rows and the usage accumulators."""

    name = "jobs"

    def __init__(self, config: ProcessorConfig) -> None:
        self.config = config

    def collect(self, snap: Snapshot) -> Iterator[Metric]:
        gpus, jobs = self.frames(snap)
        yield gauge("gpuledger_job_info", "A running job attempt (value 1) and its attributes.",
                    jobs.with_columns(pl.lit(1.0).alias("one")),
                    [*JOB_LABELS, "user", "priority"], "one", any_card=True)
        for name, col, doc in (
            ("gpuledger_job_activity_ratio", "activity",
             "Mean activity (0-1) over the job's GPUs in the latest closed minute."),
            ("gpuledger_job_allocated_gpus", "allocated", "GPUs the job holds (sum of fractions)."),
            ("gpuledger_job_memory_held_bytes", "held_bytes",
             "Memory held per GPU (card memory x fraction; the largest of the job's GPUs)."),
            ("gpuledger_job_memory_peak_bytes", "peak_bytes",
             "Peak memory used on any one of the job's GPUs since it started."),
            ("gpuledger_job_memory_used_bytes", "used_bytes",
             "Memory used on the job's GPUs in the latest closed minute."),
            ("gpuledger_job_runtime_seconds", "runtime_s",
             "Event time from the attempt's start to the end of the latest closed minute."),
            ("gpuledger_job_wasted_gpu_seconds", "waste_gpu_seconds",
             "Allocated minus used GPU time of the attempt so far, in GPU-seconds "
             "(3600 = one GPU-hour)."),
        ):
            yield gauge(name, doc, jobs, JOB_LABELS, col, any_card=True)
        for name, col, doc in (
            ("gpuledger_job_gpu_activity_ratio", "activity",
             "Activity (0-1) of one GPU of a running job, latest closed minute."),
            ("gpuledger_job_gpu_memory_used_bytes", "used_bytes",
             "Memory used on one GPU of a running job, latest closed minute."),
            ("gpuledger_job_gpu_processes", "processes",
             "Processes on one GPU of a running job, latest closed minute."),
        ):
            yield gauge(name, doc, gpus, GPU_LABELS, col, any_card=True)
        blocked = snap.table("blocked_minute")
        if "card_type" in blocked.columns:
            blocked = blocked.rename({"card_type": "requested_card_type"})
        yield gauge("gpuledger_job_blocked_gpus",
                    "A pending job blocked by fragmentation in the latest closed minute; the "
                    "value is the GPUs it requests.", blocked, BLOCKED_LABELS, "gpus",
                    any_card=True)

    def frames(self, snap: Snapshot) -> tuple[pl.DataFrame, pl.DataFrame]:
        """(per running job and GPU, per running job) for the latest minute."""
        allocs = snap.allocations
        if snap.until is None or allocs.is_empty():
            return pl.DataFrame(), pl.DataFrame()
        keys = ["job_id", "attempt"]
        gpu = snap.table("gpu_minute")
        ctx = gpu.select("node", "gpu_index", "card_type", "activity", "telemetry_samples",
                         "mem_used_mib", "processes") if not gpu.is_empty() else pl.DataFrame(
                             schema={"node": pl.String, "gpu_index": pl.Int64,
                                     "card_type": pl.String, "activity": pl.Float64,
                                     "telemetry_samples": pl.Int64, "mem_used_mib": pl.Float64,
                                     "processes": pl.Int64})
        attrs = snap.attributes.select(
            "job_id", "team", "queue", "pool",
            pl.col("card_type").fill_null(ANY_CARD).alias("requested_card_type"),
            "job_type", "user", "priority")
        per_gpu = allocs.join(ctx, on=["node", "gpu_index"], how="left").with_columns(
            pl.when(pl.col("telemetry_samples") > 0).then(pl.col("activity")).alias("activity"),
            (pl.col("mem_used_mib") * MIB).alias("used_bytes"),
            pl.col("gpu_index").alias("gpu"),
        ).join(attrs, on="job_id", how="left")
        observed = pl.col("activity").is_not_null()
        frac = pl.col("fraction")
        until = pl.lit(snap.until).cast(TIME_DTYPE)
        jobs = per_gpu.group_by(keys).agg(
            frac.sum().alias("allocated"),
            ((frac * pl.col("activity")).sum() / frac.filter(observed).sum()).alias("activity"),
            pl.col("used_bytes").sum().alias("used_bytes"),
            ((until - pl.col("start").min()).dt.total_milliseconds() / 1000.0)
            .alias("runtime_s"),
        ).with_columns(
            pl.when(pl.col("activity").is_nan()).then(None).otherwise(pl.col("activity"))
            .alias("activity"))
        usage = attempt_usage(snap.usage if not snap.usage.is_empty()
                              else pl.DataFrame(schema=ACC_SCHEMA), self.config)
        jobs = jobs.join(usage.select(
            *keys, (pl.col("mem_peak_mib") * MIB).alias("peak_bytes"),
            (pl.col("mem_held_mib") * MIB).alias("held_bytes"),
            (pl.col("waste_gpu_hours") * SECONDS_PER_HOUR).alias("waste_gpu_seconds")),
            on=keys, how="left").join(attrs, on="job_id", how="left")
        return per_gpu, jobs
