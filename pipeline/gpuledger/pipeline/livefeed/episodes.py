"""The feed's simulation, planned lazily: one episode of at most a day at a time.

Planning a simulated span runs the scheduler model over all of it first (a week of the
built-in cluster takes minutes), so the feed cuts its span into *episodes* of at most
:data:`EPISODE_HOURS` and plans each one only when its first minute is needed: the first
message goes out within a second or two for any ``--hours``, and ``loop`` goes on
forever. Episode ``n`` is the simulator's run of its hours from its own start with seed
``seed + n`` (the cluster loaded from its first minute, as always); its job ids are
moved up by ``n × 1,000,000`` so that they never collide with an earlier episode's. At
an episode's end every job still pending or running there gets a ``cancelled`` event
(reason :data:`END_REASON`), stamped with the next episode's start, before that
episode's first events: the GPUs are free again when the next episode's jobs take them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import polars as pl

from gpuledger.contract.schema import JOB_END_EVENTS
from gpuledger.pipeline.columns import TIME_DTYPE
from gpuledger.pipeline.simulate import SimConfig, simulate

EPISODE_HOURS = 24.0
JOB_ID_STEP = 1_000_000
END_REASON = "simulated episode ended (gpuledger feed starts the next one)"

Batch = dict[str, pl.DataFrame]


@dataclass(frozen=True)
class Minute:
    """One published minute: its batch and the end of the simulated span it covers."""

    batch: Batch
    end: datetime


def episodes(sim: SimConfig, loop: bool = False) -> Iterator[Minute]:
    """Batches of ``sim.chunk_minutes`` from ``sim.start`` for ``sim.hours`` (forever
    with ``loop``), planned one episode at a time (module doc)."""
    per = min(sim.hours, EPISODE_HOURS)
    count = math.inf if loop else math.ceil(sim.hours / per - 1e-9)
    closing: pl.DataFrame | None = None
    n = 0
    start = sim.start
    while n < count:
        hours = per if loop else min(per, sim.hours - n * per)
        config = replace(sim, start=start, hours=hours, seed=sim.seed + n)
        step = timedelta(minutes=sim.chunk_minutes)
        end = start
        seen: list[pl.DataFrame] = []
        for batch in simulate(config):
            if n:
                batch = _renumber(batch, n * JOB_ID_STEP)
            if closing is not None:
                batch = {**batch, "job": pl.concat([closing, batch["job"]])}
                closing = None
            seen.append(batch["job"])
            end = min(end + step, start + timedelta(hours=hours))
            yield Minute(batch, end)
        closing = _open_jobs(pl.concat(seen), end)
        start = end
        n += 1


def _renumber(batch: Batch, offset: int) -> Batch:
    def moved(col: pl.Expr) -> pl.Expr:
        return (col.cast(pl.Int64) + offset).cast(pl.String)

    job = batch["job"].with_columns(moved(pl.col("job_id")).alias("job_id"))
    tel = batch["telemetry"].with_columns(pl.col("processes").list.eval(
        pl.element().struct.with_fields(moved(pl.field("job_id")).alias("job_id"))))
    return {**batch, "job": job, "telemetry": tel}


def _open_jobs(events: pl.DataFrame, at: datetime) -> pl.DataFrame:
    """A ``cancelled`` event at ``at`` for every job whose last event does not end it."""
    last = events.group_by("job_id", maintain_order=True).last()
    return last.filter(~pl.col("event").is_in(list(JOB_END_EVENTS))).with_columns(
        pl.lit("cancelled").alias("event"), pl.lit(END_REASON).alias("reason"),
        pl.lit(at).cast(TIME_DTYPE).alias("time"),
        pl.lit(None, events.schema["borrowed"]).alias("borrowed"),
        pl.lit(None, events.schema["allocation"]).alias("allocation"),
    ).select(events.columns)
