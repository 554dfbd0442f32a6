"""Recommendations per job attempt, and back-fill / preemption candidates.

Each rule reads finished attempt facts (or the running snapshot) and emits rows
``(job_id, attempt, team, kind, gpu_hours, evidence, recommendation)``; ``gpu_hours`` is
what is at stake, so teams can sort by it. Rules:

================== ==============================================================
``right_size_card`` card mismatch: the job would fit a slower card tier
``right_size_memory`` memory over-sized: peak < 25 % of the memory it held
``reduce_gpus``    at least 25 % of the job's observed GPUs stayed idle (at least two
                   observed)
``improve_efficiency`` busy-but-inefficient: mean activity under the efficiency threshold
``release_idle``   an interactive job idle for more than half of its observed GPU-hours
``preemption_candidate`` running, preemptible, borrowed or low priority, checkpointable
``backfill_candidate`` pending, preemptible, fits the largest free block now (of its
                   card type; a job of any card type: of some card type of its pool)
================== ==============================================================
"""

from __future__ import annotations

from datetime import datetime

import polars as pl

from gpuledger.pipeline.config import ProcessorConfig

REC_SCHEMA = pl.Schema(
    {
        "job_id": pl.String,
        "attempt": pl.Int64,
        "team": pl.String,
        "queue": pl.String,
        "kind": pl.String,
        "gpu_hours": pl.Float64,
        "evidence": pl.String,
        "recommendation": pl.String,
    }
)


def _pct(expr: pl.Expr) -> pl.Expr:
    return (expr * 100).round(1).cast(pl.String) + pl.lit(" %")


def _num(expr: pl.Expr, digits: int = 1) -> pl.Expr:
    return expr.round(digits).cast(pl.String)


def for_attempts(attempts: pl.DataFrame, config: ProcessorConfig) -> pl.DataFrame:
    """Recommendations from attempt facts with usage (see :mod:`job_usage`)."""
    t = config.thresholds
    if attempts.is_empty():
        return pl.DataFrame(schema=REC_SCHEMA)
    a = attempts.filter(pl.col("observed_gpu_hours") > 0)
    act = pl.col("used_gpu_hours") / pl.col("observed_gpu_hours")
    no_tel = pl.col("gpus_no_telemetry").fill_null(0) if "gpus_no_telemetry" in a.columns \
        else pl.lit(0)
    rules: list[tuple[str, pl.Expr, pl.Expr, pl.Expr, pl.Expr]] = [
        (
            "right_size_card",
            pl.col("suggested_card_type").is_not_null(),
            pl.col("mismatch_gpu_hours"),
            pl.lit("peak memory ") + _num(pl.col("mem_peak_mib"), 0)
            + pl.lit(" MiB, mean activity ") + _pct(act)
            + pl.lit(" on ") + pl.col("held_card_type"),
            pl.lit("run on ") + pl.col("suggested_card_type") + pl.lit(" instead of ")
            + pl.col("held_card_type"),
        ),
        (
            "right_size_memory",
            pl.col("memory_oversized"),
            # the hours whose memory was seen: a GPU that never reported may have used it
            pl.col("observed_gpu_hours") * (1 - pl.col("mem_peak_ratio")),
            pl.lit("peak memory ") + _num(pl.col("mem_peak_mib"), 0) + pl.lit(" MiB of ")
            + _num(pl.col("mem_held_mib"), 0) + pl.lit(" MiB held (")
            + _pct(pl.col("mem_peak_ratio")) + pl.lit(") over ")
            + _num(pl.col("observed_gpu_hours"), 2) + pl.lit(" observed GPU-hours"),
            pl.lit("request about ") + _num(pl.col("mem_peak_mib") * 1.25, 0)
            + pl.lit(" MiB per GPU, or share the GPU (MIG / fractional)"),
        ),
        (
            "reduce_gpus",
            # observed GPUs only: a GPU without telemetry is neither idle nor busy
            (pl.col("gpus_observed") > 1)
            & (pl.col("idle_gpus") >= t.reduce_gpus_idle_share * pl.col("gpus_observed"))
            & (pl.col("idle_gpus") < pl.col("gpus_observed")),
            pl.col("observed_gpu_hours") * pl.col("idle_gpus") / pl.col("gpus_observed"),
            _num(pl.col("idle_gpus"), 0) + pl.lit(" of ") + _num(pl.col("gpus_observed"), 0)
            + pl.lit(" observed GPUs stayed idle")
            + pl.when(no_tel > 0).then(
                pl.lit(" (") + _num(no_tel, 0) + pl.lit(" more had no telemetry)"))
            .otherwise(pl.lit("")),
            pl.lit("request ")
            + _num(pl.col("gpus_observed") + no_tel - pl.col("idle_gpus"), 0)
            + pl.lit(" GPUs"),
        ),
        (
            "improve_efficiency",
            (act >= t.idle_activity) & (act < t.efficient_activity),
            pl.col("waste_gpu_hours"),
            pl.lit("mean activity ") + _pct(act) + pl.lit(" over ")
            + _num(pl.col("allocated_gpu_hours")) + pl.lit(" GPU-hours"),
            pl.lit("check data loading, batch size and host-side bottlenecks "
                   "(PCIe/NVLink, CPU) before asking for more GPUs"),
        ),
        (
            "release_idle",
            # idle more than half the time it was seen: hours without telemetry are
            # neither idle nor busy (they kept a notebook idle all it reported unadvised)
            (pl.col("job_type") == "interactive")
            & (pl.col("idle_gpu_hours") > 0.5 * pl.col("observed_gpu_hours")),
            pl.col("idle_gpu_hours"),
            _num(pl.col("idle_gpu_hours")) + pl.lit(" of ")
            + _num(pl.col("observed_gpu_hours")) + pl.lit(" observed GPU-hours idle")
            + pl.when(pl.col("allocated_gpu_hours") > pl.col("observed_gpu_hours") + 1e-9)
            .then(pl.lit(" (") + _num(pl.col("allocated_gpu_hours")
                                      - pl.col("observed_gpu_hours"))
                  + pl.lit(" more without telemetry)")).otherwise(pl.lit("")),
            pl.lit("add an idle timeout to notebooks, or move them to shared/fractional GPUs"),
        ),
    ]
    parts = [
        a.filter(cond.fill_null(False)).select(
            "job_id", "attempt", "team", "queue", pl.lit(kind).alias("kind"),
            hours.alias("gpu_hours"), evidence.alias("evidence"), text.alias("recommendation"),
        )
        for kind, cond, hours, evidence, text in rules
    ]
    return pl.concat(parts).select(REC_SCHEMA.names()).cast(dict(REC_SCHEMA))  # type: ignore[arg-type]


def candidates(
    running: pl.DataFrame, usage: pl.DataFrame, free_blocks: pl.DataFrame,
    low_priority: int, now: datetime | None,
) -> pl.DataFrame:
    """Preemption candidates (running) and back-fill candidates (pending).

    ``running``: running-attempt rows; ``usage``: their usage so far (``job_usage.
    attempt_usage``: ``allocated_gpu_hours`` up to the closed point); ``free_blocks``:
    latest ``largest_free_block`` per pool and card type; ``low_priority``: priorities
    at or below count as low; ``now``: the closed point (None: nothing closed yet).

    GPU-hours at stake: a preemption candidate's are the GPU-hours its running attempt
    has held so far (``allocated_gpu_hours``); a back-fill candidate's are the GPU-hours
    it has waited for, requested GPUs × pending time up to ``now``.
    """
    if running.is_empty():
        return pl.DataFrame(schema=REC_SCHEMA)
    now_expr = pl.lit(now, dtype=running.schema["queued_at"])
    hours = pl.duration(hours=1)

    def since(col: str) -> pl.Expr:
        """Hours from ``col`` to ``now``, none before it."""
        if now is None:
            return pl.lit(0.0)
        return pl.max_horizontal((now_expr - pl.col(col)) / hours, pl.lit(0.0))

    held = usage.select("job_id", "attempt", "allocated_gpu_hours")
    run = running.filter(
        pl.col("started_at").is_not_null()
        & pl.col("preemptible").fill_null(False)
        & pl.col("checkpointable").fill_null(False)
        & (pl.col("borrowed").fill_null(False) | (pl.col("priority") <= low_priority))
    ).join(held, on=["job_id", "attempt"], how="left").with_columns(
        pl.coalesce("last_checkpoint_at", "started_at").alias("_since"),
    ).with_columns(
        (pl.col("allocated_gpus") * since("_since")).alias("_exposed"),
    ).select(
        "job_id", "attempt", "team", "queue", pl.lit("preemption_candidate").alias("kind"),
        pl.col("allocated_gpu_hours").fill_null(0.0).alias("gpu_hours"),
        (pl.lit("priority ") + pl.col("priority").cast(pl.String)
         + pl.when(pl.col("borrowed")).then(pl.lit(", borrowed")).otherwise(pl.lit(""))
         + pl.lit(", checkpointable, ") + pl.col("allocated_gpus").cast(pl.String)
         + pl.lit(" GPUs, ") + _num(pl.col("_exposed"), 2)
         + pl.when(pl.col("last_checkpoint_at").is_null())
         .then(pl.lit(" GPU-h since its start (no checkpoint yet)"))
         .otherwise(pl.lit(" GPU-h since its last checkpoint"))).alias("evidence"),
        pl.lit("reclaim these GPUs first when guaranteed work waits").alias("recommendation"),
    )
    pend = running.filter(
        pl.col("started_at").is_null() & pl.col("preemptible").fill_null(False)
    )
    blocks = free_blocks.select(
        "pool", "card_type", pl.col("card_type").alias("_card"), "largest_free_block")
    # a job that accepts any card type of its pool runs on one of them: it fits when one
    # of them has a free block as large as it needs; the largest block is its evidence
    largest = blocks.sort(["largest_free_block", "_card"], descending=[True, False],
                          nulls_last=True).group_by("pool", maintain_order=True).first()
    fits = pl.concat([
        pend.filter(pl.col("card_type").is_not_null()).join(
            blocks, on=["pool", "card_type"], how="inner"),
        pend.filter(pl.col("card_type").is_null()).join(
            largest.drop("card_type"), on="pool", how="inner"),
    ], how="diagonal_relaxed")
    back = fits.filter(pl.col("gpus") <= pl.col("largest_free_block")).select(
        "job_id", "attempt", "team", "queue", pl.lit("backfill_candidate").alias("kind"),
        (pl.col("gpus") * since("queued_at")).alias("gpu_hours"),
        (pl.lit("needs ") + pl.col("gpus").cast(pl.String)
         + pl.when(pl.col("card_type").is_null()).then(pl.lit(" GPUs of any card type"))
         .otherwise(pl.lit(" GPUs"))
         + pl.lit(", largest free block ") + pl.col("largest_free_block").cast(pl.String)
         + pl.lit(" on ") + pl.col("_card").fill_null("?")
         + pl.lit(", pending ")
         + (since("queued_at") * 60).round(0).cast(pl.Int64).cast(pl.String) + pl.lit(" min"))
        .alias("evidence"),
        pl.lit("start it now on idle capacity as preemptible back-fill").alias("recommendation"),
    )
    return pl.concat([run, back]).cast(dict(REC_SCHEMA))  # type: ignore[arg-type]
