"""What a late job event does to closed minutes: closed facts are not rewritten, so an
attempt's end that arrives after its minute closed leaves the GPU charged to the attempt
up to the closed point, and a late start leaves the time before it uncharged.

:func:`charged_ms` gives, per allocation (attempt × GPU), the GPU-milliseconds charged
in ``[lo, hi)`` by the allocations as the job book holds them; taken before and after a
batch's job events are applied, :func:`late_error` says how much the closed minutes got
wrong each way. Facts stay as they were (docs/metrics.md, "Late, out-of-order,
duplicated and impossible events"); the counts say how far.
"""

from __future__ import annotations

import polars as pl

from gpuledger.pipeline.facts.minutes import clip_ms

KEY = ["job_id", "attempt", "node", "gpu_index"]


def charged_ms(allocations: pl.DataFrame, lo_ms: int, hi_ms: int) -> pl.DataFrame:
    """Per allocation: ``charged``, fraction × milliseconds of ``[start, end)`` inside
    ``[lo_ms, hi_ms)`` (an open allocation runs to ``hi_ms``)."""
    return clip_ms(allocations, "start", "end", lo_ms, hi_ms).group_by(KEY).agg(
        (pl.col("fraction") * (pl.col("e_ms") - pl.col("s_ms"))).sum().alias("charged")
    ).collect()


def late_error(before: pl.DataFrame, after: pl.DataFrame) -> tuple[int, int]:
    """(charged too much, charged too little), in GPU-milliseconds: per allocation, what
    the closed minutes were charged (``before``, :func:`charged_ms` as the book stood
    when they closed) against what it holds now (``after``)."""
    both = before.join(after, on=KEY, how="full", coalesce=True, suffix="_now").select(
        (pl.col("charged_now").fill_null(0) - pl.col("charged").fill_null(0)).alias("d"))
    over, under = both.select(
        (-pl.col("d")).clip(lower_bound=0).sum().alias("over"),
        pl.col("d").clip(lower_bound=0).sum().alias("under")).row(0)
    return round(over or 0), round(under or 0)
