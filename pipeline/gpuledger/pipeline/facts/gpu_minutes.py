"""GPU-minutes from three inputs: inventory runs, allocation pieces, telemetry aggregates.

One close step turns, for the GPUs of the partitions it closes:

- *runs*: one row per GPU and inventory run ``[from_ms, to_ms)`` (minute-aligned), with
  the node's attributes (``state/inventory.py``);
- *pieces*: one row per allocation of a GPU clipped to the step ``[s_ms, e_ms)``, exact to
  the millisecond (``state/jobs.py``);
- *telemetry*: one row per GPU-minute with samples (``telemetry_minutes.py``);

into two frames:

- **GPU rows**: the ``gpu_minute`` facts, one row per GPU and minute (or, for a GPU
  without telemetry in the step, per *span* of identical minutes: see :mod:`spans`), with
  ``alloc_fraction`` (Σ fraction × seconds held / 60: the GPU share allocated in the
  minute), ``occupied_share`` (seconds with any allocation / 60), the main job, the
  telemetry means and the ``state``;
- **job rows**: one row per (job attempt, GPU, minute or span) with its ``share`` (fraction
  × seconds held / 60) and ``held`` (seconds held / 60), joined to its GPU row's state,
  activity and memory: what job usage and the share-based roll-ups are built from.

Every row has ``n_minutes`` (1, or the span's length) so that sums weigh spans right.
"""

from __future__ import annotations

import polars as pl

from gpuledger.pipeline.config import Thresholds
from gpuledger.pipeline.facts.gpu_state import classify
from gpuledger.pipeline.facts.minutes import MINUTE_MS, expand_held
from gpuledger.pipeline.facts.telemetry_minutes import READING_DTYPE

GPU_KEYS = ["node", "gpu_index"]
MINUTE_KEYS = ["minute_ms", "node", "gpu_index"]
R = READING_DTYPE
TELEMETRY_COLUMNS = {
    "activity": R, "telemetry_samples": pl.Int64(), "telemetry_card_type": pl.String(),
    "util_gpu": R, "sm_active": R, "sm_occupancy": R, "tensor_active": R, "dram_active": R,
    "mem_used_mib": R, "mem_total_mib": R, "power_w": R, "temp_c": R, "sm_clock_mhz": R,
    "pcie_rx_bytes_s": R, "pcie_tx_bytes_s": R, "nvlink_rx_bytes_s": R,
    "nvlink_tx_bytes_s": R, "xid_errors": pl.Int64(), "ecc_sbe": pl.Int64(),
    "ecc_dbe": pl.Int64(), "processes": pl.Int64(), "unattributed_processes": pl.Int64(),
    "telemetry_unhealthy": pl.Boolean(),
}


def gpu_runs(node_runs: pl.DataFrame) -> pl.LazyFrame:
    """Node runs → one row per GPU of the node (``gpu_unhealthy`` from the record)."""
    return (
        node_runs.lazy()
        .with_columns(pl.int_ranges(0, pl.col("gpu_count")).alias("gpu_index"))
        .explode("gpu_index")
        .filter(pl.col("gpu_index").is_not_null())
        .with_columns(
            pl.col("unhealthy_gpus").fill_null(pl.lit([], pl.List(pl.Int64())))
            .list.contains(pl.col("gpu_index")).alias("gpu_unhealthy"))
        .drop("unhealthy_gpus", "gpu_count")
    )


def merged_occupancy(pieces: pl.LazyFrame) -> pl.LazyFrame:
    """The union of a GPU's pieces: overlapping pieces (jobs sharing the GPU) merged, so
    that the time a GPU is *occupied* counts once however many jobs hold it."""
    ordered = pieces.select(*GPU_KEYS, "s_ms", "e_ms").sort([*GPU_KEYS, "s_ms"])
    reach = pl.col("e_ms").cum_max().shift(1).over(GPU_KEYS)
    return (
        ordered.with_columns((pl.col("s_ms") > reach).fill_null(True).alias("_new"))
        .with_columns(pl.col("_new").cum_sum().over(GPU_KEYS).alias("_run"))
        .group_by([*GPU_KEYS, "_run"])
        .agg(pl.col("s_ms").min(), pl.col("e_ms").max())
        .drop("_run")
    )


def job_minute_rows(pieces: pl.LazyFrame) -> pl.LazyFrame:
    """Pieces → (job attempt, GPU, minute) rows with ``share`` and ``held`` (GPU-minutes)."""
    return expand_held(pieces).select(
        "job_id", "attempt", *GPU_KEYS, "partition", "fraction", "minute_ms",
        (pl.col("fraction") * pl.col("held_ms") / MINUTE_MS).alias("share"),
        (pl.col("held_ms") / MINUTE_MS).alias("held"),
    )


def allocation_per_gpu_minute(jobs: pl.LazyFrame, occupancy: pl.LazyFrame) -> pl.LazyFrame:
    """Per GPU-minute: the share allocated, the share occupied, how many jobs, and the
    main job (the largest share; ties by job id)."""
    occ = expand_held(occupancy).group_by(MINUTE_KEYS).agg(
        (pl.col("held_ms").sum() / MINUTE_MS).alias("occupied_share"))
    alloc = (
        jobs.sort(["share", "job_id"], descending=[True, False])
        .group_by(MINUTE_KEYS)
        .agg(
            pl.col("share").sum().alias("alloc_fraction"),
            pl.len().cast(pl.Int64).alias("jobs_on_gpu"),
            pl.col("job_id").first(),
            pl.col("attempt").first(),
        )
    )
    return alloc.join(occ, on=MINUTE_KEYS, how="left")


def dense_gpu_rows(
    runs: pl.LazyFrame, alloc: pl.LazyFrame, telemetry: pl.LazyFrame | None,
    thresholds: Thresholds,
) -> pl.LazyFrame:
    """One row per GPU-minute of the runs: inventory ⟕ allocation ⟕ telemetry, classified.

    Allocations and telemetry of GPU-minutes outside the runs are not here (the caller
    reports them: no inventory, no such GPU)."""
    grid = runs.with_columns(
        pl.int_ranges(pl.col("from_ms"), pl.col("to_ms"), MINUTE_MS).alias("minute_ms")
    ).explode("minute_ms").drop("from_ms", "to_ms")
    base = grid.join(alloc, on=MINUTE_KEYS, how="left")
    if telemetry is not None:
        base = base.join(telemetry, on=MINUTE_KEYS, how="left")
    else:
        base = base.with_columns(pl.lit(None, dtype).alias(name)
                                 for name, dtype in TELEMETRY_COLUMNS.items())
    return finish_gpu_rows(base.with_columns(pl.lit(1, pl.Int64).alias("n_minutes")), thresholds)


def finish_gpu_rows(base: pl.LazyFrame, thresholds: Thresholds) -> pl.LazyFrame:
    """Fill defaults and classify GPU rows (dense minutes and spans alike)."""
    return base.with_columns(
        pl.coalesce(pl.col("card_type"), pl.col("telemetry_card_type")).alias("card_type"),
        pl.col("alloc_fraction").fill_null(0.0),
        pl.col("occupied_share").fill_null(0.0),
        pl.col("jobs_on_gpu").fill_null(0),
        pl.col("telemetry_samples").fill_null(0),
        (pl.col("alloc_fraction").fill_null(0.0) > 0).alias("allocated"),
        (
            (pl.col("health") == "down").fill_null(False)
            | pl.col("gpu_unhealthy").fill_null(False)
            | pl.col("telemetry_unhealthy").fill_null(False)
        ).alias("unhealthy"),
        (pl.col("processes").fill_null(0) > 0).alias("has_process"),
    ).with_columns(classify(thresholds))


def job_rows_with_context(jobs: pl.LazyFrame, gpu: pl.LazyFrame) -> pl.LazyFrame:
    """Job rows joined to their GPU row: state, activity, memory and card context."""
    ctx = gpu.select(
        *MINUTE_KEYS, "n_minutes", "state", "unhealthy", "alloc_fraction", "occupied_share",
        "activity", "telemetry_samples", "mem_used_mib", "card_type", "pool",
        "gpu_mem_mib", pl.col("mem_total_mib").alias("_tel_total"))
    return jobs.join(ctx, on=MINUTE_KEYS, how="inner").with_columns(
        pl.coalesce(pl.col("gpu_mem_mib"), pl.col("_tel_total")).alias("gpu_mem_total_mib"),
    ).drop("_tel_total")
