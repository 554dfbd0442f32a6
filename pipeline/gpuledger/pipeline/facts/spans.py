"""GPUs without telemetry: runs of identical minutes kept as *spans*, not row by row.

A GPU that sent no sample in a close step (a history from the scheduler alone — openb,
``sacct``, pod lists — or a node without an agent) has minutes that differ only where
something changed: an allocation started or ended, its inventory changed, an hour began
(files are hourly). Between those boundaries every minute is the same, so the step
keeps one *span* row ``(minute, minutes, ...)`` for them instead of a row per minute:
a history without telemetry costs per change, not per GPU-minute.

A minute in which an allocation starts or ends at a second that is not the minute's
start (an *edge minute*) is held only in part: it is computed like a telemetry minute,
exactly to the second (``gpu_minutes.py``). The ``gpu_minute`` view expands spans back
into minutes (``sql/00_facts.sql``), so analysts see the same rows either way.
"""

from __future__ import annotations

import polars as pl

from gpuledger.pipeline import engines
from gpuledger.pipeline.facts.gpu_minutes import GPU_KEYS, MINUTE_KEYS, TELEMETRY_COLUMNS
from gpuledger.pipeline.facts.minutes import HOUR_MS, MINUTE_MS, ceil_minute_ms, floor_minute_ms

RUN_KEYS = [*GPU_KEYS, "from_ms"]


def _boundaries(runs: pl.LazyFrame, pieces: pl.LazyFrame) -> pl.LazyFrame:
    """Every minute-aligned boundary inside each run (``_run``, its number): its ends,
    whole hours, and the minutes around each allocation's start and end."""
    hours = runs.select(
        "_run", pl.int_ranges((pl.col("from_ms") // HOUR_MS + 1) * HOUR_MS, pl.col("to_ms"),
                              HOUR_MS).alias("t")).explode("t")
    ends = runs.select("_run", pl.concat_list("from_ms", "to_ms").alias("t")).explode("t")
    cuts = pieces.select(*GPU_KEYS, pl.concat_list(
        floor_minute_ms(pl.col("s_ms")), ceil_minute_ms(pl.col("s_ms")),
        floor_minute_ms(pl.col("e_ms")), ceil_minute_ms(pl.col("e_ms"))).alias("t")
    ).explode("t").join(runs.select(*GPU_KEYS, "_run", "from_ms", "to_ms"), on=GPU_KEYS,
                        how="inner").filter(
        (pl.col("t") > pl.col("from_ms")) & (pl.col("t") < pl.col("to_ms")))
    return pl.concat([ends, hours.filter(pl.col("t").is_not_null()), cuts.select("_run", "t")]
                     ).unique()


def _edge_minutes(pieces: pl.LazyFrame) -> pl.LazyFrame:
    """Minutes an allocation starts or ends inside (at a second other than :00)."""
    s, e = pl.col("s_ms"), pl.col("e_ms")
    return pl.concat([
        pieces.filter(s % MINUTE_MS != 0).select(*GPU_KEYS, floor_minute_ms(s).alias("u")),
        pieces.filter(e % MINUTE_MS != 0).select(*GPU_KEYS, floor_minute_ms(e).alias("u")),
    ]).unique().with_columns(pl.lit(True).alias("edge"))


def split_runs(runs: pl.LazyFrame, pieces: pl.LazyFrame) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """A sparse GPU's runs cut at every boundary: (edge minutes as one-minute runs, for the
    exact path; span segments ``u``/``v`` with the run's attributes)."""
    # the runs numbered in their keys' order: the boundaries are sorted by two integers
    # (the run's number, the time), not by the node's name (a 24-hour step of the openb
    # trace's 6,212 GPUs: 155,000 boundaries, 42 ms sorted by name, 13 by number), and
    # each run's next boundary is the next row's when it is of the same run
    numbered = runs.sort(RUN_KEYS).with_row_index("_run")
    bounds = _boundaries(numbered, pieces).sort(["_run", "t"])
    same_run = pl.col("_run") == pl.col("_run").shift(-1)
    # collected once: the edges and the spans are read by separate plans
    segments = engines.step_frame(
        bounds.with_columns(pl.when(same_run).then(pl.col("t").shift(-1)).alias("v"))
        .filter(pl.col("v").is_not_null())
        .rename({"t": "u"})
        .join(numbered, on="_run", how="inner")
        .select(*RUN_KEYS, "u", "v", pl.exclude(*RUN_KEYS, "u", "v", "_run"))
        .join(_edge_minutes(pieces), on=[*GPU_KEYS, "u"], how="left")
    ).lazy()
    edges = segments.filter(pl.col("edge").fill_null(False)).with_columns(
        pl.col("u").alias("from_ms"), pl.col("v").alias("to_ms")).drop("u", "v", "edge")
    spans = segments.filter(~pl.col("edge").fill_null(False)).drop("edge", "from_ms", "to_ms")
    return edges, spans


def span_rows(spans: pl.LazyFrame, pieces: pl.LazyFrame) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """Span segments → (GPU rows, job rows), both with ``n_minutes`` = the span's length.

    No allocation starts or ends inside a span, so each job holding any of it holds
    all of it, for whole minutes: its share per minute is its fraction."""
    held = spans.select(*GPU_KEYS, "u", "v").join(
        pieces.select(*GPU_KEYS, "job_id", "attempt", "partition", "fraction", "s_ms", "e_ms"),
        on=GPU_KEYS, how="inner").filter(
        (pl.col("s_ms") < pl.col("v")) & (pl.col("e_ms") > pl.col("u")))
    # collected once: the GPU rows (through ``alloc``) and the job rows both read it
    jobs = engines.step_frame(held.select(
        "job_id", "attempt", *GPU_KEYS, "partition", "fraction",
        pl.col("u").alias("minute_ms"), pl.col("fraction").alias("share"),
        pl.lit(1.0).alias("held"),
        ((pl.col("v") - pl.col("u")) // MINUTE_MS).alias("n_minutes"))).lazy()
    alloc = (
        jobs.sort(["share", "job_id"], descending=[True, False])
        .group_by(MINUTE_KEYS)
        .agg(
            pl.col("share").sum().alias("alloc_fraction"),
            pl.lit(1.0).alias("occupied_share"),
            pl.len().cast(pl.Int64).alias("jobs_on_gpu"),
            pl.col("job_id").first(),
            pl.col("attempt").first(),
        )
    )
    gpu = spans.with_columns(
        pl.col("u").alias("minute_ms"),
        ((pl.col("v") - pl.col("u")) // MINUTE_MS).alias("n_minutes"),
    ).drop("u", "v").join(alloc, on=MINUTE_KEYS, how="left").with_columns(
        pl.lit(None, dtype).alias(name) for name, dtype in TELEMETRY_COLUMNS.items())
    return gpu, jobs.drop("n_minutes")
