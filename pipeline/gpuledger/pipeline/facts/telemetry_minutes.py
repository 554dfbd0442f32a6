"""Telemetry samples → one row per GPU-minute (columnar, whole batches).

Duplicated samples (same node, GPU, MIG instance and time) count once. MIG instances of
one GPU are first summed (memory, processes) and averaged (activity) per sample time,
so a MIG-partitioned GPU is still one GPU-minute.
"""

from __future__ import annotations

import polars as pl

from gpuledger.pipeline.facts.gpu_state import sample_activity
from gpuledger.pipeline.facts.minutes import minute_of

TELEMETRY_KEEP = [
    "time", "node", "agent", "seq", "gpu_index", "gpu_uuid", "card_type", "mig_instance",
    "util_gpu", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
    "mem_used_mib", "mem_total_mib", "power_w", "temp_c", "sm_clock_mhz",
    "pcie_rx_bytes_s", "pcie_tx_bytes_s", "nvlink_rx_bytes_s", "nvlink_tx_bytes_s",
    "xid_errors", "ecc_sbe", "ecc_dbe", "healthy", "processes",
]

_MEANS = ["util_gpu", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
          "power_w", "sm_clock_mhz", "pcie_rx_bytes_s", "pcie_tx_bytes_s",
          "nvlink_rx_bytes_s", "nvlink_tx_bytes_s"]


def prepare(telemetry: pl.DataFrame) -> pl.DataFrame:
    """Keep the columns facts need and add ``minute`` and per-sample ``activity``."""
    return telemetry.select(TELEMETRY_KEEP).with_columns(
        minute_of(pl.col("time")).alias("minute"),
        sample_activity().alias("activity"),
        pl.col("processes").list.len().fill_null(0).alias("n_proc"),
        pl.col("processes").list.eval(pl.element().struct.field("job_id").is_null()).list.sum()
        .fill_null(0).alias("n_unattributed"),
        (
            (pl.col("healthy") == False)  # noqa: E712 - null-aware comparison
            | (pl.col("xid_errors") > 0)
            | (pl.col("ecc_dbe") > 0)
        ).fill_null(False).alias("unhealthy_sample"),
    )


def per_gpu_minute(samples: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Aggregate prepared samples to (minute, node, gpu_index); also the number of
    samples dropped as repeats of another (same node, GPU, MIG instance and time).

    Repeats are rare, so they are looked for with one cheap pass (the number of distinct
    hashes of node, GPU, MIG instance and time: equal to the row count means none); only
    when some may exist are the samples de-duplicated exactly.
    """
    keys = ["minute", "node", "gpu_index"]
    repeats = 0
    if _may_repeat(samples):
        unique = samples.unique(subset=SAMPLE_KEY, keep="first", maintain_order=True)
        repeats, samples = samples.height - unique.height, unique
    if samples.select(pl.col("mig_instance").is_not_null().any()).item():
        samples = _merge_mig(samples, keys)
    return _aggregate(samples, keys), repeats


SAMPLE_KEY = ["node", "gpu_index", "mig_instance", "time"]


def _may_repeat(samples: pl.DataFrame) -> bool:
    """Whether two samples may share node, GPU, MIG instance and time (a hash collision
    only costs the exact check)."""
    key = (pl.col("node").hash(1) ^ (pl.col("gpu_index").cast(pl.UInt64) * 0x9E3779B97F4A7C15)
           ^ pl.col("mig_instance").hash(2) ^ pl.col("time").cast(pl.Int64).hash(3))
    return bool(samples.select(key.n_unique()).item() < samples.height)


def _merge_mig(samples: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """One row per GPU and sample time from the rows of its MIG instances."""
    return samples.group_by([*keys, "time"]).agg(
        pl.col("card_type").first(),
        pl.col("seq").max(),
        pl.col("agent").first(),
        pl.col("activity").mean(),
        *[pl.col(c).mean() for c in _MEANS],
        pl.col("mem_used_mib").sum(),
        pl.col("mem_total_mib").max(),
        pl.col("temp_c").max(),
        pl.col("xid_errors").sum(),
        pl.col("ecc_sbe").sum(),
        pl.col("ecc_dbe").sum(),
        pl.col("healthy").min(),
        pl.col("unhealthy_sample").max(),
        pl.col("n_proc").sum(),
        pl.col("n_unattributed").sum(),
    ).with_columns(pl.lit(None, pl.String).alias("mig_instance"))


def _aggregate(samples: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    return samples.lazy().group_by(keys).agg(
        pl.len().cast(pl.Int64).alias("telemetry_samples"),
        pl.col("agent").first(),
        pl.col("seq").min().alias("seq_min"),
        pl.col("seq").max().alias("seq_max"),
        pl.col("card_type").first().alias("telemetry_card_type"),
        pl.col("activity").mean(),
        *[pl.col(c).mean() for c in _MEANS],
        pl.col("mem_used_mib").max(),
        pl.col("mem_total_mib").max(),
        pl.col("temp_c").max(),
        pl.col("xid_errors").sum(),
        pl.col("ecc_sbe").sum(),
        pl.col("ecc_dbe").sum(),
        pl.col("unhealthy_sample").max().alias("telemetry_unhealthy"),
        pl.col("n_proc").max().alias("processes"),
        pl.col("n_unattributed").max().alias("unattributed_processes"),
    ).with_columns(pl.col("agent").fill_null(pl.col("node"))).collect()


def job_memory(samples: pl.DataFrame) -> pl.DataFrame:
    """Peak memory of each attributed job's processes per (minute, node, gpu, job).

    Used for GPUs shared by several jobs; a job holding a whole GPU is charged the
    GPU's memory used instead (which also counts memory outside its processes).
    """
    procs = (
        samples.filter(pl.col("n_proc") > 0)
        .unique(subset=SAMPLE_KEY, keep="first")  # a repeated sample counts once
        .select("minute", "node", "gpu_index", "time", "processes")
        .explode("processes")
        .unnest("processes")
        .filter(pl.col("job_id").is_not_null())
    )
    return (
        procs.group_by(["minute", "node", "gpu_index", "time", "job_id"])
        .agg(pl.col("used_mib").sum())
        .group_by(["minute", "node", "gpu_index", "job_id"])
        .agg(pl.col("used_mib").max().alias("job_mem_mib"))
    )


def sequence_gaps(gpu_minutes: pl.DataFrame) -> pl.DataFrame:
    """Per agent: lowest and highest sequence number and samples received.

    Reads the per-GPU-minute aggregates (``seq_min``, ``seq_max``, distinct
    ``telemetry_samples``), so repeated samples are not counted as received twice.
    """
    keys = ["partition", "agent"] if "partition" in gpu_minutes.columns else ["agent"]
    return gpu_minutes.group_by(keys).agg(
        pl.col("seq_min").min(),
        pl.col("seq_max").max(),
        pl.col("telemetry_samples").sum().alias("seq_count"),
    )
