"""How far the baseline replay (the policy closest to what the cluster ran) lands from
what was observed: the error every what-if answer carries.

One check per answer and key: queue wait p50/p90/p99 by queue and overall, p90 by job
size, and each team's mean wait (tolerance:
``max(queue_wait_minutes, queue_wait_relative × observed)``), allocated and used
GPU-hours by pool and team (``gpu_hours_relative × observed``), blocked demand and lost
work by pool, overall and team (``max(gpu_hours_relative × observed, 1 GPU-hour)``),
mean frag(k) by pool and
card type (0.05). ``error`` = baseline − observed; ``within`` says whether it is inside
the tolerance.
"""

from __future__ import annotations

import polars as pl

from gpuledger.pipeline.advisor.answers import FRAGS, Answers
from gpuledger.pipeline.advisor.policy import Tolerance

FRAG_TOLERANCE = 0.05
CHECK_SCHEMA = pl.Schema({"answer": pl.String(), "key": pl.String(), "observed": pl.Float64(),
                          "baseline": pl.Float64(), "error": pl.Float64(),
                          "tolerance": pl.Float64(), "within": pl.Boolean()})


def long_form(a: Answers) -> pl.DataFrame:
    """Every answer of ``a`` as rows ``(answer, key, value)``."""
    wait = a.wait.filter(pl.col("by").is_in(["queue", "all"]))
    size = a.wait.filter(pl.col("by") == "size")
    t = a.teams
    parts = [
        wait.unpivot(["p50_min", "p90_min", "p99_min"], index="key").select(
            pl.concat_str(pl.lit("queue wait "), pl.col("variable").str.replace("_min", ""),
                          pl.lit(" (min)")).alias("answer"), "key", "value"),
        size.select(pl.lit("queue wait p90 by size (min)").alias("answer"),
                    pl.concat_str(pl.lit("GPUs "), pl.col("key")).alias("key"),
                    pl.col("p90_min").alias("value")),
        t.select(pl.lit("team mean queue wait (min)").alias("answer"), pl.col("team").alias("key"),
                 pl.col("mean_wait_min").alias("value")),
        t.select(pl.lit("team allocated GPU-hours").alias("answer"), pl.col("team").alias("key"),
                 pl.col("allocated_gpu_hours").alias("value")),
        t.select(pl.lit("team blocked GPU-hours").alias("answer"), pl.col("team").alias("key"),
                 pl.col("blocked_gpu_hours").alias("value")),
        t.select(pl.lit("team lost GPU-hours").alias("answer"), pl.col("team").alias("key"),
                 pl.col("lost_gpu_hours").alias("value")),
        a.usage.unpivot(["allocated_gpu_hours", "used_gpu_hours"], index="pool").select(
            pl.col("variable").str.replace("_gpu_hours", " GPU-hours").alias("answer"),
            pl.col("pool").alias("key"), "value"),
        a.blocked.select(pl.lit("blocked GPU-hours").alias("answer"), pl.col("pool").alias("key"),
                         pl.col("blocked_gpu_hours").alias("value")),
        a.lost.select(pl.lit("lost GPU-hours").alias("answer"), pl.lit("all").alias("key"),
                      pl.col("lost_gpu_hours").sum().alias("value")),
        a.frag.unpivot(FRAGS, index=["pool", "card_type"]).select(
            pl.concat_str(pl.lit("mean "), pl.col("variable").str.replace("_", "(") + ")")
            .alias("answer"),
            pl.concat_str("pool", "card_type", separator=" / ").alias("key"), "value"),
    ]
    return pl.concat([p.with_columns(pl.col("value").cast(pl.Float64)) for p in parts])


def calibrate(observed: Answers, baseline: Answers, tol: Tolerance) -> pl.DataFrame:
    """One row per answer and key (module docstring). A GPU-hours answer missing on one
    side is 0; a queue wait or frag(k) missing on one side (nothing started, no minute
    sampled) stays null, and so do its error and ``within``: nothing to compare."""
    hours = pl.col("answer").str.contains("GPU-hours")
    both = long_form(observed).join(long_form(baseline), on=["answer", "key"], how="full",
                                    coalesce=True, suffix="_b").select(
        "answer", "key",
        pl.when(hours).then(pl.col("value").fill_null(0.0)).otherwise(pl.col("value"))
        .alias("observed"),
        pl.when(hours).then(pl.col("value_b").fill_null(0.0)).otherwise(pl.col("value_b"))
        .alias("baseline"))
    obs = pl.col("observed").abs()
    answer = pl.col("answer")
    tolerance = (
        pl.when(answer.str.contains("queue wait"))
        .then(pl.max_horizontal(pl.lit(tol.queue_wait_minutes), obs * tol.queue_wait_relative))
        .when(answer.str.starts_with("mean frag")).then(pl.lit(FRAG_TOLERANCE))
        .when(answer.is_in(["allocated GPU-hours", "used GPU-hours",
                            "team allocated GPU-hours"]))
        .then(obs * tol.gpu_hours_relative)
        .otherwise(pl.max_horizontal(pl.lit(1.0), obs * tol.gpu_hours_relative)))
    return both.with_columns(
        (pl.col("baseline") - pl.col("observed")).alias("error"),
        tolerance.alias("tolerance"),
    ).with_columns(
        (pl.col("error").abs() <= pl.col("tolerance") + 1e-9).alias("within"),
    ).select(list(CHECK_SCHEMA)).sort("answer", key_order(), "key")


def key_order() -> pl.Expr:
    """Sort key of an answer's ``key``: job sizes ("GPUs <1", "GPUs 2", …) by number,
    "<1" first; other keys null (then sorted by text)."""
    size = pl.col("key").str.extract(r"^GPUs (<1|\d+)$")
    return pl.when(size == "<1").then(pl.lit(0.5)).otherwise(
        size.cast(pl.Float64, strict=False))
