"""The scheduler's side of the world: jobs, attempts, allocations and queue time.

:class:`JobBook` applies scheduler job events (a few per job, thousands a day, so a
plain loop over events is fine here; telemetry never passes through this module) and
keeps, for the processor's open windows:

- allocation intervals ``(job, attempt, node, gpu_index, fraction, start, end)``;
- pending intervals ``(job, attempt, queued_at, end)``;
- ended attempts and preemptions, until every partition has closed the minutes they
  cover (``processor.py`` reads them by time range, once per partition).

An *attempt* is one stay of a job in the queue followed (maybe) by one run. Attempt 0
starts at ``submitted``; ``requeued`` starts the next attempt, whose queue wait counts
from the requeue time.

Events that do not fit a job's life cycle are *rejected* with a reason (a second
``started``, a ``started`` after the job ended, a ``finished`` for a job never seen, a
``checkpointed`` of a job not running...): :meth:`JobBook.apply` returns them, and the
processor reports them with the other rejects. A repeated event (same job, kind and
time) is a duplicate and is ignored (counted).

State is bounded: intervals, attempts and preemptions are forgotten once every partition
has closed past them (plus the retention the processor asks for, so that a partition
handed over from an instance that is behind can still be closed); ended jobs are
remembered for ``ended_job_memory_s`` so that a duplicate event stays harmless.
"""

from __future__ import annotations

import itertools
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
STARTS_SCHEMA = pl.Schema({"started_at": TIME_DTYPE, "pool": pl.String(),
                           "card_type": pl.String(), "gpus": pl.Int64()})
OWNER = -1
"""Who takes ended attempts for the per-attempt totals (the owner), beside partitions."""
_ROW_LISTS = {"closed_allocs": ALLOC_SCHEMA, "closed_pending": PENDING_SCHEMA,
              "ended_attempts": ATTEMPT_SCHEMA, "preemptions": PREEMPTION_SCHEMA,
              "started_sizes": STARTS_SCHEMA}
"""The book's lists of rows, and the columns they are saved with."""
REJECTED_EVENT_SCHEMA = pl.Schema({"job_id": pl.String(), "event": pl.String(),
                                   "time": TIME_DTYPE, "reason": pl.String()})
ALLOWED: dict[str, tuple[str, ...]] = {
    "submitted": ("new",), "started": ("new", "pending"), "checkpointed": ("running",),
    "preempted": ("running",), "requeued": ("running", "pending", "preempted"),
    "finished": ("pending", "running", "preempted"), "failed": ("pending", "running", "preempted"),
    "cancelled": ("pending", "running", "preempted"),
}
"""The states a job may be in when each event arrives; any other is out of order."""
EVENT_ORDER = {"submitted": 0, "started": 1, "checkpointed": 2, "preempted": 3,
               "requeued": 4, "finished": 5, "failed": 5, "cancelled": 5}


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
    """What the book saw that did not fit the job life cycle."""

    duplicates: int = 0
    out_of_order: int = 0
    """Events rejected because they do not fit the job's life cycle."""


def _gpus(ev: dict[str, Any]) -> set[tuple[str, int, float]]:
    """The GPUs (node, index, fraction) an event's allocation names."""
    return {(a["node"], a["gpu_index"], 1.0 if a.get("fraction") is None else a["fraction"])
            for a in (ev.get("allocation") or [])}


_JOB_SCHEMA = pl.Schema({
    "job_id": pl.String(), "attempt": pl.Int64(), "status": pl.String(),
    "submitted_at": TIME_DTYPE, "queued_at": TIME_DTYPE, "started_at": TIME_DTYPE,
    "borrowed": pl.Boolean(), "last_checkpoint": TIME_DTYPE, "checkpoints": pl.Int64(),
    "ended_at": TIME_DTYPE, **{f"attr_{k}": v for k, v in ATTR_SCHEMA.items()}})
_JOB_ALLOCATION_SCHEMA = pl.Schema({"job_id": pl.String(), "node": pl.String(),
                                    "gpu_index": pl.Int64(), "fraction": pl.Float64()})
_JOB_SEEN_SCHEMA = pl.Schema({"job_id": pl.String(), "event": pl.String(), "time": TIME_DTYPE})
_JOB_SCALARS = ("job_id", "attempt", "status", "submitted_at", "queued_at", "started_at",
                "borrowed", "last_checkpoint", "checkpoints", "ended_at")


def _jobs_as_frames(jobs: dict[str, Job]) -> dict[str, pl.DataFrame]:
    """Jobs as three frames (the jobs in the book's order; allocations in each job's
    order; the events seen), for a checkpoint."""
    rows = [(*(getattr(j, f) for f in _JOB_SCALARS), *(j.attrs.get(k) for k in ATTR_SCHEMA))
            for j in jobs.values()]
    allocation = [(j.job_id, a["node"], a["gpu_index"], a["fraction"])
                  for j in jobs.values() for a in j.allocation]
    seen = [(j.job_id, kind, when) for j in jobs.values() for kind, when in j.seen]
    return {"jobs": pl.DataFrame(rows, schema=_JOB_SCHEMA, orient="row"),
            "allocation": pl.DataFrame(allocation, schema=_JOB_ALLOCATION_SCHEMA,
                                       orient="row"),
            "seen": pl.DataFrame(seen, schema=_JOB_SEEN_SCHEMA, orient="row")}


def _jobs_from_frames(frames: dict[str, pl.DataFrame]) -> dict[str, Job]:
    jobs: dict[str, Job] = {}
    n = len(_JOB_SCALARS)
    for row in frames["jobs"].select(_JOB_SCHEMA.names()).iter_rows():
        job = Job(row[0], dict(zip(ATTR_SCHEMA, row[n:], strict=True)))
        for name, value in zip(_JOB_SCALARS[1:], row[1:n], strict=True):
            setattr(job, name, value)
        jobs[job.job_id] = job
    for job_id, node, gpu, fraction in frames["allocation"].select(
            _JOB_ALLOCATION_SCHEMA.names()).iter_rows():
        jobs[job_id].allocation.append({"node": node, "gpu_index": gpu, "fraction": fraction})
    for job_id, kind, when in frames["seen"].select(_JOB_SEEN_SCHEMA.names()).iter_rows():
        jobs[job_id].seen.add((kind, when))
    return jobs


class OutOfOrder(Exception):
    """An event that does not fit the job's life cycle (the message is the reason)."""


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
        self.taken: dict[tuple[str, int], set[int]] = {}
        """Who took each ended attempt (partitions, and :data:`OWNER` for the totals)."""
        self.preemptions_taken: set[tuple[str, int]] = set()
        self._memory = timedelta(seconds=ended_job_memory_s)
        self._version = 0
        self._cache: dict[str, tuple[int, pl.DataFrame]] = {}

    # -- saved state -------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """The book as a checkpoint holds it: its jobs and its lists of rows as frames.
        Walked value by value, 10,000 running jobs took 1.6 CPU-s and 14.6 MB a
        checkpoint (every 10 s by default), as much again to read back."""
        state = {k: v for k, v in self.__dict__.items()
                 if k not in ("jobs", "_cache", *_ROW_LISTS)}
        state["job_frames"] = _jobs_as_frames(self.jobs)
        for name, schema in _ROW_LISTS.items():
            rows = getattr(self, name)  # dicts, or tuples (the sizes of starts)
            state[name] = pl.DataFrame(rows, schema=schema, orient=(
                "row" if name == "started_sizes" else None)) if rows else \
                pl.DataFrame(schema=schema)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        frames = state.pop("job_frames", None)
        if frames is not None:
            state["jobs"] = _jobs_from_frames(frames)
            for name in _ROW_LISTS:
                rows = state[name]
                state[name] = ([tuple(r) for r in rows.iter_rows()]
                               if name == "started_sizes" else rows.to_dicts())
        # (an earlier release's state holds them as they are in memory)
        self.__dict__.update(state)
        self._cache = {}  # rebuilt when asked

    # -- applying events ---------------------------------------------------------

    def apply(self, events: pl.DataFrame) -> pl.DataFrame:
        """Apply a frame of validated job events (any order; sorted here by time).

        Returns the events rejected as out of order (:data:`REJECTED_EVENT_SCHEMA`)."""
        if events.is_empty():
            return pl.DataFrame(schema=REJECTED_EVENT_SCHEMA)
        # ties of one job's events at one time are ordered by their allocation too, so
        # that two 'started' with different GPUs give the same facts in any input order
        ranked = events.with_columns(
            pl.col("event").replace_strict(EVENT_ORDER, default=9, return_dtype=pl.Int64())
            .alias("_rank"),
            (pl.col("allocation").hash() if "allocation" in events.columns
             else pl.lit(0, pl.UInt64)).alias("_tie"),
        ).sort(["time", "_rank", "job_id", "_tie"], maintain_order=True).drop("_tie")
        rejected: list[dict[str, Any]] = []
        rows = ranked.iter_rows(named=True)
        for _time, block in itertools.groupby(rows, key=lambda r: r["time"]):
            for row, reason in self._apply_instant(list(block)):
                self.counters.out_of_order += 1
                rejected.append({"job_id": row["job_id"], "event": row["event"],
                                 "time": row["time"], "reason": reason})
        self._version += 1
        return pl.DataFrame(rejected, schema=REJECTED_EVENT_SCHEMA) if rejected else \
            pl.DataFrame(schema=REJECTED_EVENT_SCHEMA)

    def _apply_instant(self, block: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
        """Apply the events of one instant (in rank order); returns those that fit no
        order, with the reason. One job's events of the same second are applied in the
        order its life cycle allows, whatever their ranks say: preempted, requeued and
        started again within a second, or started and preempted within one, both happen
        (a rank alone cannot tell them apart). An event that does not fit yet waits
        until another of its job's events of the instant has been applied."""
        waiting: dict[str, list[tuple[dict[str, Any], str]]] = {}
        for row in block:
            job_id = row["job_id"]
            try:
                self._apply_one(row)
            except OutOfOrder as exc:
                waiting.setdefault(job_id, []).append((row, str(exc)))
                continue
            if job_id in waiting:
                waiting[job_id] = self._retry(waiting[job_id])
        return [item for items in waiting.values() for item in items]

    def _retry(self, waiting: list[tuple[dict[str, Any], str]]) -> list[tuple[dict[str, Any], str]]:
        """Apply the waiting events of one job that now fit, until none does."""
        progress = True
        while progress and waiting:
            progress = False
            for i, (row, _reason) in enumerate(waiting):
                try:
                    self._apply_one(row)
                except OutOfOrder as exc:
                    waiting[i] = (row, str(exc))
                    continue
                del waiting[i]
                progress = True
                break
        return waiting

    def _apply_one(self, ev: dict[str, Any]) -> None:
        job_id: str = ev["job_id"]
        kind: str = ev["event"]
        time: datetime = ev["time"]
        job = self.jobs.get(job_id)
        if job is None:
            if kind not in ("submitted", "started"):
                raise OutOfOrder(f"{kind} for job {job_id!r}, which was never submitted or "
                                 "started")
            job = Job(job_id, {k: None for k in JOB_ATTRIBUTES})
            self.jobs[job_id] = job
        key = (kind, time)
        if key in job.seen:
            # a repeated start of the attempt the job is in must name its GPUs; one of an
            # earlier attempt (a history sent again) is a duplicate: it was refused as a
            # second start on other GPUs
            if kind == "started" and job.started_at == time \
                    and _gpus(ev) != _gpus({"allocation": job.allocation}):
                raise OutOfOrder(f"started for job {job_id!r} again at the same time with "
                                 "other GPUs (the first, in allocation order, is kept)")
            self.counters.duplicates += 1
            return
        if job.status not in ALLOWED[kind]:
            state = {"new": "not submitted yet", "pending": "pending", "running": "running",
                     "preempted": "preempted", "ended": "already ended"}[job.status]
            raise OutOfOrder(f"{kind} for job {job_id!r}, which is {state}")
        job.seen.add(key)
        for attr in JOB_ATTRIBUTES:
            if ev.get(attr) is not None:
                job.attrs[attr] = ev[attr]
        handler = getattr(self, f"_on_{kind}")
        handler(job, ev, time)

    def _on_submitted(self, job: Job, ev: dict[str, Any], time: datetime) -> None:
        job.submitted_at = time
        job.queued_at = time
        job.status = "pending"

    def _on_started(self, job: Job, ev: dict[str, Any], time: datetime) -> None:
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
        self.started_sizes.append((time, job.attrs.get("pool"), job.attrs.get("card_type"),
                                   len(job.allocation)))

    def _on_checkpointed(self, job: Job, ev: dict[str, Any], time: datetime) -> None:
        job.last_checkpoint = time
        job.checkpoints += 1

    def _on_preempted(self, job: Job, ev: dict[str, Any], time: datetime) -> None:
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
        else:
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

    def _cached(self, name: str, build: Any) -> pl.DataFrame:
        hit = self._cache.get(name)
        if hit is not None and hit[0] == self._version:
            return hit[1]
        frame: pl.DataFrame = build()
        self._cache[name] = (self._version, frame)
        return frame

    def allocations(self) -> pl.DataFrame:
        """Every allocation interval still of interest; open ones have ``end`` null."""
        def build() -> pl.DataFrame:
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
        return self._cached("allocations", build)

    def pending(self) -> pl.DataFrame:
        """Every pending interval still of interest; open ones have ``end`` null."""
        def build() -> pl.DataFrame:
            rows = list(self.closed_pending)
            rows.extend(
                {"job_id": j.job_id, "attempt": j.attempt, "queued_at": j.queued_at,
                 "end": None}
                for j in self.jobs.values()
                if j.status == "pending" and j.queued_at is not None
            )
            return pl.DataFrame(rows, schema=PENDING_SCHEMA) if rows else \
                pl.DataFrame(schema=PENDING_SCHEMA)
        return self._cached("pending", build)

    def attributes(self) -> pl.DataFrame:
        """Job attributes (current attempt) of every job in the book."""
        def build() -> pl.DataFrame:
            rows = [{"job_id": j.job_id, "attempt": j.attempt, **j.attrs,
                     "borrowed": j.borrowed} for j in self.jobs.values()]
            return pl.DataFrame(rows, schema=JOB_ATTR_FRAME_SCHEMA) if rows else \
                pl.DataFrame(schema=JOB_ATTR_FRAME_SCHEMA)
        return self._cached("attributes", build)

    def take_ended(self, hi: datetime, who: int) -> pl.DataFrame:
        """Attempts that ended at or before ``hi`` that ``who`` (a partition, or
        :data:`OWNER`) has not taken yet; they count as taken by ``who`` from now on.
        An attempt whose end arrives late (after its minute closed) is taken at the next
        close, like any other."""
        taken = self.taken
        done = [a for a in self.ended_attempts
                if a["ended_at"] <= hi and who not in taken.get((a["job_id"], a["attempt"]), ())]
        for a in done:
            taken.setdefault((a["job_id"], a["attempt"]), set()).add(who)
        return pl.DataFrame(done, schema=ATTEMPT_SCHEMA) if done else \
            pl.DataFrame(schema=ATTEMPT_SCHEMA)

    def taken_by(self, who: int) -> set[tuple[str, int]]:
        """The ended attempts ``who`` has taken (handed over with a partition)."""
        return {k for k, whom in self.taken.items() if who in whom}

    def mark_taken(self, keys: set[tuple[str, int]], who: int) -> None:
        """Record attempts ``who`` took elsewhere (a partition handed over)."""
        for key in keys:
            self.taken.setdefault(key, set()).add(who)

    def take_preemptions(self, hi: datetime) -> pl.DataFrame:
        """Preemptions at or before ``hi`` not taken yet (requeue flag settled by then)."""
        done = [p for p in self.preemptions
                if p["time"] <= hi and (p["job_id"], p["attempt"]) not in self.preemptions_taken]
        self.preemptions_taken.update((p["job_id"], p["attempt"]) for p in done)
        return pl.DataFrame(done, schema=PREEMPTION_SCHEMA) if done else \
            pl.DataFrame(schema=PREEMPTION_SCHEMA)

    def running_attempts(self) -> pl.DataFrame:
        """Attempts that have not ended (running or pending), as attempt rows."""
        def build() -> pl.DataFrame:
            rows = [self._attempt_row(j, None, None, None, 0.0)
                    for j in self.jobs.values() if j.status in ("running", "pending")]
            return pl.DataFrame(rows, schema=ATTEMPT_SCHEMA) if rows else \
                pl.DataFrame(schema=ATTEMPT_SCHEMA)
        return self._cached("running", build)

    def starts_between(self, since: datetime, until: datetime) -> pl.DataFrame:
        """Starts in ``[since, until)``: time, pool, card type, GPUs."""
        return pl.DataFrame(
            [s for s in self.started_sizes if since <= s[0] < until],
            schema=STARTS_SCHEMA, orient="row",
        )

    def merge_history(self, history: dict[str, Any]) -> None:
        """Add another book's history (a telemetry partition handed over, see
        ``checkpoint.py``): intervals, attempts and preemptions this book may have
        forgotten already. Whatever this book holds already is kept as it is."""
        def alloc_key(a: dict[str, Any]) -> tuple[Any, ...]:
            return (a["job_id"], a["attempt"], a["node"], a["gpu_index"])

        have = {alloc_key(a) for a in self.closed_allocs}
        self.closed_allocs.extend(a for a in history.get("closed_allocs", ())
                                  if alloc_key(a) not in have)
        have_pending = {(x["job_id"], x["attempt"]) for x in self.closed_pending}
        self.closed_pending.extend(x for x in history.get("closed_pending", ())
                                   if (x["job_id"], x["attempt"]) not in have_pending)
        have_ended = {(a["job_id"], a["attempt"]) for a in self.ended_attempts}
        for a in [*history.get("ended_attempts", ()), *history.get("owner_attempts", ())]:
            key = (a["job_id"], a["attempt"])
            if key not in have_ended:
                self.ended_attempts.append(a)
                have_ended.add(key)
        have_pre = {(x["job_id"], x["attempt"]) for x in self.preemptions}
        self.preemptions.extend(x for x in history.get("preemptions", ())
                                if (x["job_id"], x["attempt"]) not in have_pre)
        have_starts = set(self.started_sizes)
        self.started_sizes.extend(x for x in history.get("started_sizes", ())
                                  if x not in have_starts)
        self.started_sizes.sort(key=lambda x: x[0])
        for job_id, (attrs, attempt) in history.get("attrs", {}).items():
            if job_id not in self.jobs:  # forgotten here: it ended long ago
                self.jobs[job_id] = Job(job_id, dict(attrs), attempt=attempt, status="ended")
        self._version += 1

    def prune(self, horizon: datetime) -> None:
        """Forget what no minute at or after ``horizon`` can need any more."""
        before = (len(self.closed_allocs), len(self.closed_pending), len(self.ended_attempts))
        self.closed_allocs = [a for a in self.closed_allocs if a["end"] > horizon]
        self.closed_pending = [p for p in self.closed_pending if p["end"] > horizon]
        self.ended_attempts = [a for a in self.ended_attempts if a["ended_at"] > horizon]
        keep = {(a["job_id"], a["attempt"]) for a in self.ended_attempts}
        self.taken = {k: v for k, v in self.taken.items() if k in keep}
        self.preemptions = [p for p in self.preemptions if p["time"] > horizon]
        self.preemptions_taken &= {(p["job_id"], p["attempt"]) for p in self.preemptions}
        day = timedelta(days=1)
        self.started_sizes = [s for s in self.started_sizes if s[0] >= horizon - day]
        forget = horizon - self._memory
        gone = [j.job_id for j in self.jobs.values()
                if j.status in ("ended", "preempted") and j.ended_at is not None
                and j.ended_at < forget]
        for job_id in gone:
            del self.jobs[job_id]
        after = (len(self.closed_allocs), len(self.closed_pending), len(self.ended_attempts))
        if gone or before != after:
            self._version += 1
