"""The feed's simulation: one timeline, anchored to the calendar, planned a day at a time.

The timeline is cut into *episodes* on a fixed grid of :data:`EPISODE_HOURS` from the
Unix epoch (a UTC day each): episode ``k`` covers ``[k·E, (k+1)·E)`` and is always the
simulator's run of that whole span with seed ``seed + k`` (the cluster loaded from its
first minute, as always), its job ids moved up by ``k × 1,000,000`` so that they never
collide with another episode's. The timeline therefore depends on the seed, the cluster
and the sample interval only, not on when a run started: a run (a restarted one too)
publishes the timeline's minutes from its ``start``, and any minute that two runs publish
is the same records (the nodes' sequence numbers included). Each episode is planned only
when its first needed minute comes (a day of the built-in cluster plans in under a
second), the telemetry of minutes before ``start`` is never synthesised.

At an episode's end every job still pending or running gets a ``cancelled`` event
(reason :data:`END_REASON`), stamped with the next episode's start, before that
episode's first events: the GPUs are free again when the next episode's jobs take them.

The first minute a run publishes also carries the timeline's history that a consumer
needs to agree with it: the inventory records of this episode and the one before, up
to ``start``, and (:func:`history`) every event before ``start`` of their jobs that
are still open at ``start`` or ended within :data:`REPLAY_HOURS` of it. A run cannot
tell whether an earlier one published them, so it sends them again: where an earlier
run did, they are duplicates (same job, event and time), which the processor counts
once; where it did not (the feed was down, or this is the first run), they tell the
processor what happened meanwhile, jobs that ended included, so no job of an earlier
run is left running for ever.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import polars as pl

from gpuledger.contract.schema import JOB_END_EVENTS
from gpuledger.pipeline.columns import TIME_DTYPE, empty_frame
from gpuledger.pipeline.simulate import SimConfig, simulate
from gpuledger.pipeline.simulate.run import EPOCH

EPISODE_HOURS = 24.0
JOB_ID_STEP = 1_000_000
REPLAY_HOURS = 23.0
"""How far back the first minute of a run sends ended jobs again: below the processor's
``windows.ended_job_memory_s`` (a day by default), which keeps ended jobs so that a
repeated event stays a harmless duplicate."""
END_REASON = "simulated episode ended (gpuledger feed starts the next one)"

Batch = dict[str, pl.DataFrame]


@dataclass(frozen=True)
class Minute:
    """One published minute: its batch and the end of the simulated span it covers;
    ``replayed``: how many job events of the batch are history (:func:`history`)."""

    batch: Batch
    end: datetime
    replayed: int = 0


def episode_of(t: datetime) -> int:
    """The episode whose span holds ``t``."""
    return (t - EPOCH) // timedelta(hours=EPISODE_HOURS)


def episode_start(k: int) -> datetime:
    return EPOCH + k * timedelta(hours=EPISODE_HOURS)


def _episode(sim: SimConfig, k: int, telemetry_from: int = 0) -> Iterator[Batch]:
    """Episode ``k``'s batches (module doc); none of telemetry before ``telemetry_from``."""
    config = replace(sim, start=episode_start(k), hours=EPISODE_HOURS, seed=sim.seed + k)
    for batch in simulate(config, telemetry_from=telemetry_from):
        yield _renumber(batch, k * JOB_ID_STEP)


def episodes(sim: SimConfig, loop: bool = False) -> Iterator[Minute]:
    """The timeline's batches of ``sim.chunk_minutes`` from ``sim.start`` for
    ``sim.hours`` (forever with ``loop``), the first with the history (module doc)."""
    step = timedelta(minutes=sim.chunk_minutes)
    stop = None if loop else sim.start + timedelta(hours=sim.hours)
    k = episode_of(sim.start)
    skip = (sim.start - episode_start(k)) // step
    jobs_before, inventory_before = _previous(sim, k)
    earlier, inventory = [jobs_before], [inventory_before]
    closing: pl.DataFrame | None = None
    first = True
    while True:
        t0, t1 = episode_start(k), episode_start(k + 1)
        seen: list[pl.DataFrame] = []
        for i, batch in enumerate(_episode(sim, k, skip)):
            seen.append(batch["job"])
            if i < skip:  # before the run's start: history only
                earlier.append(batch["job"])
                inventory.append(batch["inventory"])
                continue
            if stop is not None and t0 + i * step >= stop:
                return
            replayed = 0
            if first:
                jobs = history(pl.concat(earlier), sim.start)
                batch = {**batch, "job": pl.concat([jobs, batch["job"]]),
                         "inventory": pl.concat([*inventory, batch["inventory"]])}
                replayed, first = jobs.height, False
                earlier, inventory = [], []
            if closing is not None:
                batch = {**batch, "job": pl.concat([closing, batch["job"]])}
                closing = None
            yield Minute(batch, min(t0 + (i + 1) * step, t1), replayed)
        closing = _open_jobs(pl.concat(seen), t1)
        k, skip = k + 1, 0


def _previous(sim: SimConfig, k: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Every job event of episode ``k − 1``, its closing ``cancelled`` events included,
    and its inventory."""
    batches = list(_episode(sim, k - 1, telemetry_from=1 << 62))
    events = pl.concat([b["job"] for b in batches])
    return (pl.concat([events, _open_jobs(events, episode_start(k))]),
            pl.concat([empty_frame("inventory"), *(b["inventory"] for b in batches)]))


def history(jobs: pl.DataFrame, start: datetime) -> pl.DataFrame:
    """Of the timeline's job events before ``start`` (in time order), what a run's first
    minute sends again (module doc): the events of the jobs still open at ``start`` or
    ended within :data:`REPLAY_HOURS` of it.

    A job's whole history goes, every attempt: a job preempted and started again while
    no feed ran gets its preemption and new start, and its earlier attempts' events are
    duplicates to a processor that has them (only its last attempt went, and its new
    ``started`` was refused: the job was still running its earlier attempt there)."""
    since = start - timedelta(hours=REPLAY_HOURS)
    last = jobs.group_by("job_id", maintain_order=True).last()
    keep = last.filter(~pl.col("event").is_in(list(JOB_END_EVENTS))
                       | (pl.col("time") >= since))["job_id"]
    return jobs.filter(pl.col("job_id").is_in(keep.implode()))


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
