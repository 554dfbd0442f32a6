"""The scheduler's side of the world: jobs, attempts, allocations and queue time.

:class:`JobBook` applies scheduler job events (a few per job, thousands a day, so a
plain loop over events is fine here; telemetry never passes through this module) and
keeps, for the processor's open windows:

- allocation intervals ``(job, attempt, node, gpu_index, fraction, start, end)``;
- pending intervals ``(job, attempt, queued_at, end)``;
- ended attempts and preemptions, waiting for the minutes they cover to close.

An *attempt* is one stay of a job in the queue followed (maybe) by one run. Attempt 0
starts at ``submitted``; ``requeued`` starts the next attempt, whose queue wait counts
from the requeue time. State is bounded: intervals and attempts leave the book once
the processor has closed the minutes they cover; ended jobs are remembered for
``ended_job_memory_s`` so that a duplicate event stays harmless.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import polars as pl

from gpuledger.contract.schema import JOB_ATTRIBUTES
from gpuledger.pipeline.columns import TIME_DTYPE

ATTR_SCHEMA: dict[str, pl.DataType] = {
    "team": pl.String(),
    "user": pl.String(),
    "queue": pl.String(),
    "pool": pl.String(),
    "priority": pl.Int64(),
    "job_type": pl.String(),
    "gpus": pl.Int64(),
    "card_type": pl.String(),
    "gpu_mem_mib": pl.Float64(),
    "preemptible": pl.Boolean(),
    "checkpointable": pl.Boolean(),
}

ALLOC_SCHEMA = pl.Schema(
    {
        "job_id": pl.String(),
        "attempt": pl.Int64(),
        "node": pl.String(),
        "gpu_index": pl.Int64(),
        "fraction": pl.Float64(),
        "start": TIME_DTYPE,
        "end": TIME_DTYPE,
    }
)
PENDING_SCHEMA = pl.Schema(
    {"job_id": pl.String(), "attempt": pl.Int64(), "queued_at": TIME_DTYPE, "end": TIME_DTYPE}
)
ATTEMPT_SCHEMA = pl.Schema(
    {
        "job_id": pl.String(),
        "attempt": pl.Int64(),
        **ATTR_SCHEMA,
        "borrowed": pl.Boolean(),
        "submitted_at": TIME_DTYPE,
        "queued_at": TIME_DTYPE,
        "started_at": TIME_DTYPE,
        "ended_at": TIME_DTYPE,
        "end_event": pl.String(),
        "queue_wait_s": pl.Float64(),
        "allocated_gpus": pl.Int64(),
        "nodes": pl.String(),
        "last_checkpoint_at": TIME_DTYPE,
        "checkpoints": pl.Int64(),
        "lost_gpu_hours": pl.Float64(),
        "reason": pl.String(),
    }
)
PREEMPTION_SCHEMA = pl.Schema(
    {
        "time": TIME_DTYPE,
        "job_id": pl.String(),
        "attempt": pl.Int64(),
        "team": pl.String(),
        "queue": pl.String(),
        "pool": pl.String(),
        "card_type": pl.String(),
        "priority": pl.Int64(),
        "borrowed": pl.Boolean(),
        "checkpointable": pl.Boolean(),
        "allocated_gpus": pl.Int64(),
        "started_at": TIME_DTYPE,
        "last_checkpoint_at": TIME_DTYPE,
        "lost_gpu_hours": pl.Float64(),
        "requeued": pl.Boolean(),
        "reason": pl.String(),
    }
)
JOB_ATTR_FRAME_SCHEMA = pl.Schema({"job_id": pl.String(), "attempt": pl.Int64(), **ATTR_SCHEMA,
                                   "borrowed": pl.Boolean()})


@dataclass
class Job:
    """One job as the scheduler reported it so far."""

    job_id: str
    attrs: dict[str, Any]
    submitted_at: datetime | None = None
    attempt: int = 0
    status: str = "new"  # new | pending | running | preempted | ended
    queued_at: datetime | None = None
    started_at: datetime | None = None
    borrowed: bool = False
    allocation: list[dict[str, Any]] = field(default_factory=list)
    last_checkpoint: datetime | None = None
    checkpoints: int = 0
    ended_at: datetime | None = None
    seen: set[tuple[str, datetime]] = field(default_factory=set)


@dataclass
class BookCounters:
    """What the book saw that did not fit the job life cycle (counted, not fatal)."""

    duplicates: int = 0
    out_of_order: int = 0


class JobBook:
    """Applies job events in time order and hands out interval tables."""

    def __init__(self, ended_job_memory_s: int = 86_400) -> None:
        self.jobs: dict[str, Job] = {}
        self.closed_allocs: list[dict[str, Any]] = []
        self.closed_pending: list[dict[str, Any]] = []
        self.ended_attempts: list[dict[str, Any]] = []
        self.preemptions: list[dict[str, Any]] = []
        self.started_sizes: list[tuple[datetime, str | None, str | None, int]] = []
        self.counters = BookCounters()
        self._memory = timedelta(seconds=ended_job_memory_s)

    # -- applying events ---------------------------------------------------------

    def apply(self, events: pl.DataFrame) -> None:
        """Apply a frame of validated job events (any order; sorted here by time)."""
        if events.is_empty():
            return
        order = {"submitted": 0, "started": 1, "checkpointed": 2, "preempted": 3,
                 "requeued": 4, "finished": 5, "failed": 5, "cancelled": 5}
        ranked = events.with_columns(
            pl.col("event").replace_strict(order, default=9, return_dtype=pl.Int64()).alias("_rank")
        ).sort(["time", "_rank", "job_id"], maintain_order=True)
        for row in ranked.iter_rows(named=True):
            self._apply_one(row)

    def _apply_one(self, ev: dict[str, Any]) -> None:
        job_id: str = ev["job_id"]
        kind: str = ev["event"]
        time: datetime = ev["time"]
        job = self.jobs.get(job_id)
        if job is None:
            job = Job(job_id, {k: None for k in JOB_ATTRIBUTES})
            self.jobs[job_id] = job
        key = (kind, time)
        if key in job.seen:
            self.counters.duplicates += 1
            return
        job.seen.add(key)
        for attr in JOB_ATTRIBUTES:
            if ev.get(attr) is not None:
                job.attrs[attr] = ev[attr]
        handler = getattr(self, f"_on_{kind}")
        handler(job, ev, time)

    def _on_submitted(self, job: Job, ev: dict[str, Any], time: datetime) -> None:
        if job.status != "new":
            self.counters.out_of_order += 1
            return
        job.submitted_at = time
        job.queued_at = time
        job.status = "pending"

    def _on_started(self, job: Job, ev: dict[str, Any], time: datetime) -> None:
        if job.status == "running":
            self.counters.out_of_order += 1
            return
        if job.status == "ended":
            self.counters.out_of_order += 1
            return
        if job.status == "pending" and job.queued_at is not None:
            self.closed_pending.append(
                {"job_id": job.job_id, "attempt": job.attempt, "queued_at": job.queued_at,
                 "end": time}
            )
        job.status = "running"
        job.started_at = time
        job.borrowed = bool(ev.get("borrowed") or False)
        job.allocation = [
            {"node": a["node"], "gpu_index": a["gpu_index"],
             "fraction": 1.0 if a.get("fraction") is None else a["fraction"]}
            for a in (ev.get("allocation") or [])
        ]
        job.last_checkpoint = None
        job.checkpoints = 0
        gpus = len(job.allocation)
        self.started_sizes.append((time, job.attrs.get("pool"), job.attrs.get("card_type"), gpus))

    def _on_checkpointed(self, job: Job, ev: dict[str, Any], time: datetime) -> None:
        if job.status != "running":
            self.counters.out_of_order += 1
            return
        job.last_checkpoint = time
        job.checkpoints += 1

    def _on_preempted(self, job: Job, ev: dict[str, Any], time: datetime) -> None:
        if job.status != "running":
            self.counters.out_of_order += 1
            return
        lost = self._end_attempt(job, time, "preempted", ev.get("reason"))
        self.preemptions.append(
            {"time": time, "job_id": job.job_id, "attempt": job.attempt,
             "team": job.attrs.get("team"), "queue": job.attrs.get("queue"),
             "pool": job.attrs.get("pool"), "card_type": job.attrs.get("card_type"),
             "priority": job.attrs.get("priority"), "borrowed": job.borrowed,
             "checkpointable": job.attrs.get("checkpointable"),
             "allocated_gpus": len(job.allocation), "started_at": job.started_at,
             "last_checkpoint_at": job.last_checkpoint, "lost_gpu_hours": lost,
             "requeued": False, "reason": ev.get("reason")}
        )
        job.status = "preempted"
        job.ended_at = time

    def _on_requeued(self, job: Job, ev: dict[str, Any], time: datetime) -> None:
        if job.status == "running":
            self._end_attempt(job, time, "requeued", ev.get("reason"))
        elif job.status == "pending":
            # an attempt that ran unseen (a bridge that missed it between two polls):
            # it ends here, without a start, and the next one waits from the requeue
            self._end_pending(job, time, "requeued", ev.get("reason"))
        elif job.status not in ("preempted",):
            self.counters.out_of_order += 1
            return
        if job.status == "preempted":
            for p in reversed(self.preemptions):
                if p["job_id"] == job.job_id and p["attempt"] == job.attempt:
                    p["requeued"] = True
                    break
        job.attempt += 1
        job.ended_at = None
        job.queued_at = time
        job.started_at = None
        job.allocation = []
        job.status = "pending"

    def _on_finished(self, job: Job, ev: dict[str, Any], time: datetime) -> None:
        self._finish(job, ev, time, "finished")

    def _on_failed(self, job: Job, ev: dict[str, Any], time: datetime) -> None:
        self._finish(job, ev, time, "failed")

    def _on_cancelled(self, job: Job, ev: dict[str, Any], time: datetime) -> None:
        self._finish(job, ev, time, "cancelled")

    def _finish(self, job: Job, ev: dict[str, Any], time: datetime, kind: str) -> None:
        if job.status == "running":
            self._end_attempt(job, time, kind, ev.get("reason"))
        elif job.status == "pending":
            self._end_pending(job, time, kind, ev.get("reason"))
        elif job.status == "ended":
            self.counters.out_of_order += 1
            return
        job.status = "ended"
        job.ended_at = time

    def _end_pending(self, job: Job, time: datetime, kind: str, reason: Any) -> None:
        """End an attempt that never started."""
        if job.queued_at is not None:
            self.closed_pending.append(
                {"job_id": job.job_id, "attempt": job.attempt, "queued_at": job.queued_at,
                 "end": time}
            )
        self.ended_attempts.append(self._attempt_row(job, time, kind, reason, 0.0))

    def _end_attempt(self, job: Job, time: datetime, kind: str, reason: Any) -> float:
        assert job.started_at is not None
        for a in job.allocation:
            self.closed_allocs.append(
                {"job_id": job.job_id, "attempt": job.attempt, "node": a["node"],
                 "gpu_index": a["gpu_index"], "fraction": a["fraction"],
                 "start": job.started_at, "end": time}
            )
        lost = 0.0
        if kind == "preempted":
            since = max(job.last_checkpoint or job.started_at, job.started_at)
            held = sum(a["fraction"] for a in job.allocation)
            lost = held * (time - since).total_seconds() / 3600.0
        self.ended_attempts.append(self._attempt_row(job, time, kind, reason, lost))
        return lost

    def _attempt_row(
        self, job: Job, ended: datetime | None, kind: str | None, reason: Any, lost: float
    ) -> dict[str, Any]:
        wait = None
        if job.started_at is not None and job.queued_at is not None:
            wait = (job.started_at - job.queued_at).total_seconds()
        nodes = sorted({a["node"] for a in job.allocation})
        return {
            "job_id": job.job_id, "attempt": job.attempt, **job.attrs,
            "borrowed": job.borrowed if job.started_at is not None else None,
            "submitted_at": job.submitted_at, "queued_at": job.queued_at,
            "started_at": job.started_at, "ended_at": ended, "end_event": kind,
            "queue_wait_s": wait,
            "allocated_gpus": len(job.allocation) if job.started_at is not None else 0,
            "nodes": ",".join(nodes) if nodes else None,
            "last_checkpoint_at": job.last_checkpoint, "checkpoints": job.checkpoints,
            "lost_gpu_hours": lost, "reason": None if reason is None else str(reason),
        }

    # -- tables for the processor ----------------------------------------------------

    def allocations(self) -> pl.DataFrame:
        """Every allocation interval still of interest; open ones have ``end`` null."""
        rows = list(self.closed_allocs)
        for job in self.jobs.values():
            if job.status == "running" and job.started_at is not None:
                rows.extend(
                    {"job_id": job.job_id, "attempt": job.attempt, "node": a["node"],
                     "gpu_index": a["gpu_index"], "fraction": a["fraction"],
                     "start": job.started_at, "end": None}
                    for a in job.allocation
                )
        return pl.DataFrame(rows, schema=ALLOC_SCHEMA, orient="row") if rows else \
            pl.DataFrame(schema=ALLOC_SCHEMA)

    def pending(self) -> pl.DataFrame:
        """Every pending interval still of interest; open ones have ``end`` null."""
        rows = list(self.closed_pending)
        rows.extend(
            {"job_id": j.job_id, "attempt": j.attempt, "queued_at": j.queued_at, "end": None}
            for j in self.jobs.values()
            if j.status == "pending" and j.queued_at is not None
        )
        return pl.DataFrame(rows, schema=PENDING_SCHEMA) if rows else \
            pl.DataFrame(schema=PENDING_SCHEMA)

    def attributes(self) -> pl.DataFrame:
        """Job attributes (current attempt) of every job in the book."""
        rows = [{"job_id": j.job_id, "attempt": j.attempt, **j.attrs, "borrowed": j.borrowed}
                for j in self.jobs.values()]
        return pl.DataFrame(rows, schema=JOB_ATTR_FRAME_SCHEMA) if rows else \
            pl.DataFrame(schema=JOB_ATTR_FRAME_SCHEMA)

    def take_ended_attempts(self, before: datetime) -> pl.DataFrame:
        """Remove and return the attempts that ended before ``before``."""
        done = [a for a in self.ended_attempts if a["ended_at"] <= before]
        self.ended_attempts = [a for a in self.ended_attempts if a["ended_at"] > before]
        return pl.DataFrame(done, schema=ATTEMPT_SCHEMA) if done else \
            pl.DataFrame(schema=ATTEMPT_SCHEMA)

    def running_attempts(self) -> pl.DataFrame:
        """Attempts that have not ended (running or pending), as attempt rows."""
        rows = [self._attempt_row(j, None, None, None, 0.0)
                for j in self.jobs.values() if j.status in ("running", "pending")]
        return pl.DataFrame(rows, schema=ATTEMPT_SCHEMA) if rows else \
            pl.DataFrame(schema=ATTEMPT_SCHEMA)

    def take_preemptions(self, before: datetime) -> pl.DataFrame:
        """Remove and return preemptions before ``before`` (requeue flag settled)."""
        done = [p for p in self.preemptions if p["time"] <= before]
        self.preemptions = [p for p in self.preemptions if p["time"] > before]
        return pl.DataFrame(done, schema=PREEMPTION_SCHEMA) if done else \
            pl.DataFrame(schema=PREEMPTION_SCHEMA)

    def started_size_weights(self, since: datetime, until: datetime) -> pl.DataFrame:
        """Starts in ``[since, until)``: time, pool, card type, GPUs (older ones dropped)."""
        self.started_sizes = [s for s in self.started_sizes if s[0] >= since]
        return pl.DataFrame(
            [s for s in self.started_sizes if s[0] < until],
            schema={"started_at": TIME_DTYPE, "pool": pl.String(), "card_type": pl.String(),
                    "gpus": pl.Int64()},
            orient="row",
        )

    def prune(self, closed_until: datetime) -> None:
        """Forget what no open minute can need any more."""
        self.closed_allocs = [a for a in self.closed_allocs if a["end"] > closed_until]
        self.closed_pending = [p for p in self.closed_pending if p["end"] > closed_until]
        horizon = closed_until - self._memory
        for job_id in [j.job_id for j in self.jobs.values()
                       if j.status in ("ended", "preempted") and j.ended_at is not None
                       and j.ended_at < horizon]:
            del self.jobs[job_id]
