"""Per-job usage: allocation vs use, idle vs inefficient, memory, card mismatch.

Each closed GPU-minute (or span of minutes) a job holds adds to the job's accumulators,
per GPU, weighted by its *share*: the fraction of the GPU it holds × the seconds it held
it / 60 (docs/metrics.md). When the attempt ends (and all its minutes are closed) the
accumulators become one ``job_attempts`` row. The summed accumulators are integers
(``fixed.py``), so a fact does not depend on how the minutes were stepped:

- ``allocated_gpu_hours`` = Σ share / 60 (a 30 s attempt on 8 whole GPUs: 4 GPU-minutes)
  over the minutes its GPU was not ``unavailable`` (unhealthy, an XID, its node down):
  those minutes are the GPU's unavailable time in the roll-ups, not the job's, so a
  team's jobs add up to the team's row
- ``job_gpu_hours`` = Σ seconds held / 3600 per GPU, whatever the fraction (pods × GPUs)
- ``observed_gpu_hours`` = the allocated share of minutes with telemetry;
  ``no_telemetry_gpu_hours`` = allocated − observed (activity unknown: neither idle nor
  used, never waste)
- ``used_gpu_hours``      = Σ share · activity / 60
- ``idle_gpu_hours`` / ``inefficient_gpu_hours``: the observed share whose activity was
  below the idle / efficiency threshold; ``waste_gpu_hours`` = observed − used
- ``gpus_observed``: the GPUs with telemetry in at least one of the job's charged minutes;
  ``idle_gpus``: those of them whose mean activity was below the idle threshold;
  ``gpus_no_telemetry`` (not a stored column: the recommendations' evidence): GPUs
  charged to the job that never reported, whose use is unknown
- ``mem_peak_mib``: the highest memory used on any of its GPUs (a shared GPU charges
  the job only its own processes' memory); ``mem_held_mib`` = card memory · fraction of
  that GPU; *memory over-sized* when peak < ``memory_oversized_ratio`` · held
- card mismatch: the job's peak memory and activity would fit a slower card of the
  configured tiers (peak ≤ headroom · that card's memory, and activity scaled by the
  speed ratio ≤ ``lower_tier_max_activity``); its GPU-hours on the faster card are
  ``mismatch_gpu_hours``.
"""

from __future__ import annotations

import polars as pl

from gpuledger.pipeline import engines
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.facts import fixed
from gpuledger.pipeline.facts.gpu_state import below

ACC_KEYS = ["job_id", "attempt", "node", "gpu_index"]
ACC_SCHEMA = pl.Schema(
    {
        "job_id": pl.String,
        "attempt": pl.Int64,
        "node": pl.String,
        "gpu_index": pl.Int64,
        "partition": pl.Int64,
        "card_type": pl.String,
        "gpu_mem_total_mib": pl.Float64,
        "fraction": pl.Float64,
        "alloc_min": pl.Int64,
        "held_min": pl.Int64,
        "used_min": pl.Int64,
        "idle_min": pl.Int64,
        "inefficient_min": pl.Int64,
        "observed_min": pl.Int64,
        "mem_peak_mib": pl.Float64,
    }
)
SUMMED = ("alloc_min", "held_min", "used_min", "idle_min", "inefficient_min", "observed_min")
"""Summed across close steps, in fixed-point units (``fixed.py``): exact in any order."""


def minute_usage(job_rows: pl.LazyFrame, config: ProcessorConfig) -> pl.DataFrame:
    """Accumulator increments from job rows (``gpu_minutes.job_rows_with_context``, with
    ``job_mem_mib``: the job's own processes' memory on a shared GPU, null if unknown)."""
    t = config.thresholds
    act = pl.col("activity")
    charged = pl.col("state") != "unavailable"
    sampled = (pl.col("telemetry_samples") > 0) & act.is_not_null()
    seen = sampled & charged
    weight = pl.col("share") * pl.col("n_minutes")
    units = fixed.units(pl.when(charged).then(weight).otherwise(0.0))
    frac = pl.col("fraction")
    mem = pl.when(frac >= 1.0).then(pl.col("mem_used_mib")).otherwise(pl.col("job_mem_mib"))
    return engines.kept_frame(job_rows.group_by(ACC_KEYS).agg(
        pl.col("partition").first(),
        pl.col("card_type").drop_nulls().first(),
        pl.col("gpu_mem_total_mib").max(),
        frac.max().alias("fraction"),
        units.sum().alias("alloc_min"),
        fixed.units(pl.col("held") * pl.col("n_minutes")).sum().alias("held_min"),
        fixed.units(weight * act).filter(seen).sum().alias("used_min"),
        units.filter(seen & below(act, t.idle_activity)).sum().alias("idle_min"),
        units.filter(seen & ~below(act, t.idle_activity) & below(act, t.efficient_activity))
        .sum().alias("inefficient_min"),
        units.filter(seen).sum().alias("observed_min"),
        mem.filter(sampled).max().alias("mem_peak_mib"),
    ).select(ACC_SCHEMA.names()).cast(dict(ACC_SCHEMA)))  # type: ignore[arg-type]


def merge(acc: pl.DataFrame, inc: pl.DataFrame) -> pl.DataFrame:
    """Add increments to accumulators."""
    if inc.is_empty():
        return acc
    both = pl.concat([acc, inc]) if not acc.is_empty() else inc
    return both.group_by(ACC_KEYS).agg(
        pl.col("partition").first(),
        pl.col("card_type").drop_nulls().first(),
        pl.col("gpu_mem_total_mib").max(),
        pl.col("fraction").max(),
        *[pl.col(c).sum() for c in SUMMED],
        pl.col("mem_peak_mib").max(),
    ).select(ACC_SCHEMA.names())


def conform(acc: pl.DataFrame) -> pl.DataFrame:
    """Accumulators as this version holds them (an older checkpoint or instance held the
    summed columns as float GPU-minutes)."""
    return fixed.conform(acc, list(SUMMED), 1.0)


def per_gpu(acc: pl.DataFrame) -> pl.DataFrame:
    """``job_gpu`` facts: one row per job attempt and GPU."""
    return acc.with_columns(
        fixed.to_hours(pl.col("alloc_min")).alias("allocated_gpu_hours"),
        fixed.to_hours(pl.col("held_min")).alias("job_gpu_hours"),
        fixed.to_hours(pl.col("used_min")).alias("used_gpu_hours"),
        fixed.to_hours(pl.col("idle_min")).alias("idle_gpu_hours"),
        fixed.to_hours(pl.col("inefficient_min")).alias("inefficient_gpu_hours"),
        pl.when(pl.col("observed_min") > 0)
        .then(pl.col("used_min") / pl.col("observed_min")).alias("mean_activity"),
        (pl.col("gpu_mem_total_mib") * pl.col("fraction")).alias("mem_held_mib"),
        fixed.to_minutes(pl.col("observed_min")).alias("observed_min"),
    ).drop("alloc_min", "held_min", "used_min", "idle_min", "inefficient_min")


def attempt_usage(acc: pl.DataFrame, config: ProcessorConfig) -> pl.DataFrame:
    """Per (job, attempt) usage totals from the per-GPU accumulators."""
    t = config.thresholds
    per = acc.with_columns(
        pl.when(pl.col("observed_min") > 0)
        .then(pl.col("used_min") / pl.col("observed_min")).alias("_gpu_act"),
        (pl.col("gpu_mem_total_mib") * pl.col("fraction")).alias("_held"),
    )
    out = per.group_by(["job_id", "attempt"]).agg(
        fixed.to_hours(pl.col("alloc_min").sum()).alias("allocated_gpu_hours"),
        fixed.to_hours(pl.col("held_min").sum()).alias("job_gpu_hours"),
        fixed.to_hours(pl.col("used_min").sum()).alias("used_gpu_hours"),
        fixed.to_hours(pl.col("idle_min").sum()).alias("idle_gpu_hours"),
        fixed.to_hours(pl.col("inefficient_min").sum()).alias("inefficient_gpu_hours"),
        fixed.to_hours(pl.col("observed_min").sum()).alias("observed_gpu_hours"),
        pl.col("mem_peak_mib").max().alias("mem_peak_mib"),
        pl.col("_held").max().alias("mem_held_mib"),
        pl.col("card_type").drop_nulls().first().alias("held_card_type"),
        (pl.col("observed_min") > 0).sum().alias("gpus_observed"),
        ((pl.col("observed_min") == 0) & (pl.col("alloc_min") > 0)).sum()
        .alias("gpus_no_telemetry"),
        below(pl.col("_gpu_act"), t.idle_activity).sum().alias("idle_gpus"),
    )
    return out.with_columns(
        (pl.col("observed_gpu_hours") - pl.col("used_gpu_hours")).alias("waste_gpu_hours"),
        (pl.col("allocated_gpu_hours") - pl.col("observed_gpu_hours"))
        .alias("no_telemetry_gpu_hours"),
        pl.when(pl.col("observed_gpu_hours") > 0)
        .then(pl.col("used_gpu_hours") / pl.col("observed_gpu_hours"))
        .alias("utilisation_of_allocation"),
        pl.when(pl.col("observed_gpu_hours") > 0)
        .then(pl.col("mem_peak_mib") / pl.col("mem_held_mib"))
        .alias("mem_peak_ratio"),
    ).with_columns(
        (
            (pl.col("observed_gpu_hours") > 0)
            & (pl.col("mem_peak_ratio") < t.memory_oversized_ratio)
        ).fill_null(False).alias("memory_oversized"),
    )


def card_mismatch(usage: pl.DataFrame, config: ProcessorConfig) -> pl.DataFrame:
    """Add ``suggested_card_type`` and ``mismatch_gpu_hours`` to attempt usage rows."""
    t = config.thresholds
    tiers = pl.DataFrame(
        {
            "_card": list(config.card_tiers),
            "_mem": [c.memory_mib for c in config.card_tiers.values()],
            "_speed": [c.relative_speed for c in config.card_tiers.values()],
        },
        schema={"_card": pl.String, "_mem": pl.Float64, "_speed": pl.Float64},
    )
    base = usage.join(
        tiers.rename({"_card": "held_card_type", "_speed": "_held_speed", "_mem": "_held_mem"}),
        on="held_card_type", how="left",
    )
    act = pl.col("used_gpu_hours") / pl.col("observed_gpu_hours")
    candidates = (
        base.filter(pl.col("observed_gpu_hours") > 0)
        .select("job_id", "attempt", "mem_peak_mib", "_held_speed", act.alias("_act"))
        .join(tiers, how="cross")
        .filter(
            (pl.col("_speed") < pl.col("_held_speed"))
            & (pl.col("mem_peak_mib") <= t.lower_tier_memory_headroom * pl.col("_mem"))
            & (pl.col("_act") * pl.col("_held_speed") / pl.col("_speed")
               <= t.lower_tier_max_activity)
        )
        .sort(["job_id", "attempt", "_speed", "_card"])
        .group_by(["job_id", "attempt"], maintain_order=True)
        .first()
        .select("job_id", "attempt", pl.col("_card").alias("suggested_card_type"))
    )
    return base.drop("_held_speed", "_held_mem").join(
        candidates, on=["job_id", "attempt"], how="left"
    ).with_columns(
        pl.when(pl.col("suggested_card_type").is_not_null())
        .then(pl.col("allocated_gpu_hours")).otherwise(0.0).alias("mismatch_gpu_hours")
    )
