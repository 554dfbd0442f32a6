"""Diffing Slurm snapshots into contract v1 job events and inventory records.

:class:`SlurmTracker` remembers, per job, what it has already told (submitted, the
running attempt and its start time, the restart count, the end) and per node the last
inventory record it sent. :meth:`SlurmTracker.step` takes the controller's current
view and returns the records that describe what changed; its memory is plain JSON
(:meth:`to_json` / :meth:`from_json`) so that the bridge can persist it.

How Slurm's states become events (the full table is in ``docs/slurm.md``):

* a job seen for the first time → ``submitted`` at SubmitTime;
* RUNNING (COMPLETING, ...) with GRES IDX and a new StartTime → ``started`` with the
  allocation, at StartTime;
* the restart count went up (``scontrol requeue``, preemption with requeue) →
  ``requeued`` at the new SubmitTime (Slurm resets it at the requeue), also when the
  attempt before it was never seen running (it ran between two polls, or before the
  bridge's first poll: a job first seen with a restart count gets ``submitted`` and
  ``requeued`` at that SubmitTime, so its earlier attempt still counts);
* PREEMPTED → ``preempted`` at EndTime, then ``cancelled`` when the job is not
  requeueable or still PREEMPTED at the next poll (Slurm 22.05 shows a preemption with
  ``PreemptMode=REQUEUE`` only as a requeue: the restart count goes up);
* COMPLETED → ``finished``; CANCELLED → ``cancelled``; FAILED, TIMEOUT, NODE_FAIL,
  OUT_OF_MEMORY, BOOT_FAIL, DEADLINE → ``failed`` with the state and exit code as the
  reason; all at EndTime;
* gone from ``squeue`` before an end was seen → ``cancelled`` at the poll time, with a
  reason saying the final state is unknown.

A job that ran without the bridge seeing it run gets no ``started`` (its GPUs are not
known) and its end says why: "ran N s between two polls (allocation not observed)", or,
for a job already over at the bridge's first poll, "not observed by the bridge (started
before it ran)".

Jobs that ask for no GPU are ignored.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from gpuledger.bridges.mapping import Mapping
from gpuledger.bridges.placement import GpuCountCheck
from gpuledger.bridges.slurm_parse import SlurmJob, SlurmNode
from gpuledger.contract.schema import CONTRACT_VERSION

log = logging.getLogger("gpuledger.bridges.slurm")

Record = dict[str, Any]

_FAILED_STATES = ("FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                  "DEADLINE", "REVOKED", "SPECIAL_EXIT")
_DOWN_STATES = ("down", "fail", "failing", "unknown", "future")


def rfc3339(epoch: float) -> str:
    """Epoch seconds → ``2026-01-05T10:00:10.000Z``."""
    t = datetime.fromtimestamp(epoch, UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


@dataclass
class JobMemory:
    """What the tracker has already said about one job."""

    restarts: int = 0
    running_start: float | None = None
    """StartTime of the attempt reported as started (null: not running)."""
    preempted: bool = False
    ended: bool = False


@dataclass
class StepStats:
    """Counts of one step (and, summed, of a bridge's life)."""

    events: int = 0
    inventory: int = 0
    start_unseen: int = 0
    """Jobs that started and ended between two polls: no allocation was observed."""
    before_bridge: int = 0
    """Jobs that had started (and ended) before the bridge's first poll."""
    requeue_unseen: int = 0
    """Requeues of an attempt the bridge never saw running."""
    vanished: int = 0
    """Jobs that left squeue before an end state was seen."""


class SlurmTracker:
    """Turns successive controller views into events, remembering what it has sent."""

    def __init__(self, mapping: Mapping, job_id_prefix: str = "",
                 inventory_refresh_s: float = 300.0) -> None:
        self.mapping = mapping
        self.prefix = job_id_prefix
        self.inventory_refresh_s = inventory_refresh_s
        self.jobs: dict[str, JobMemory] = {}
        self.nodes: dict[str, tuple[str, float]] = {}  # node → (record without time, sent at)
        self.last_poll: float | None = None
        """The time of the last step (None: the bridge has never polled)."""
        self._counts = GpuCountCheck(log)

    # -- memory --------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {"jobs": {k: asdict(v) for k, v in self.jobs.items()},
                "nodes": {k: list(v) for k, v in self.nodes.items()},
                "last_poll": self.last_poll}

    def load_json(self, doc: dict[str, Any]) -> None:
        self.jobs = {k: JobMemory(**v) for k, v in doc.get("jobs", {}).items()}
        self.nodes = {k: (v[0], float(v[1])) for k, v in doc.get("nodes", {}).items()}
        last = doc.get("last_poll")
        # a state file from before last_poll was kept: it has polled if it knows anything
        self.last_poll = float(last) if last is not None else (
            0.0 if self.jobs or self.nodes else None)

    # -- one poll ------------------------------------------------------------------

    def step(self, jobs: list[SlurmJob], nodes: list[SlurmNode] | None,
             now: float, unreadable: Collection[str] = ()) -> tuple[list[Record], StepStats]:
        """Records for what changed since the last step (jobs in time order per job).

        ``unreadable``: ids of jobs Slurm still lists whose entry could not be read
        safely this time; they are not taken for gone (their memory is kept as it is)."""
        stats = StepStats()
        out: list[Record] = []
        if nodes is not None:
            out.extend(self._inventory(nodes, now, stats))
        seen = set()
        for job in jobs:
            if job.gpus <= 0:
                continue
            seen.add(job.job_id)
            out.extend(self._job(job, now, stats))
        for job_id in [j for j in self.jobs if j not in seen and j not in unreadable]:
            memory = self.jobs.pop(job_id)
            if not memory.ended:
                stats.vanished += 1
                reason = ("preempted and not requeued" if memory.preempted else
                          "left squeue before an end state was seen; final state unknown")
                out.append(self._event("cancelled", job_id, now, reason=reason))
        stats.events = sum(1 for r in out if r["type"] == "job")
        stats.inventory = len(out) - stats.events
        self.last_poll = now
        return out, stats

    def _job(self, job: SlurmJob, now: float, stats: StepStats) -> list[Record]:
        memory = self.jobs.get(job.job_id)
        out: list[Record] = []
        first_seen = memory is None
        if memory is None:
            # a job first seen with restarts: its earlier attempts are counted below
            memory = self.jobs[job.job_id] = JobMemory(restarts=0)
            out.append(self._event("submitted", job.job_id, job.submit or now,
                                   **self._attributes(job)))
        if memory.ended:
            return out
        if job.restarts > memory.restarts:
            if job.state == "COMPLETING":
                return out  # the requeue is under way; Slurm sets the new SubmitTime after
            when = job.submit if job.submit and job.submit <= now else now
            reason = f"requeued by Slurm (restart {job.restarts})"
            if memory.running_start is None and not memory.preempted:
                stats.requeue_unseen += 1
                reason += ("; the attempt before it ran before the bridge's first poll"
                           if first_seen and self.last_poll is None else
                           "; the attempt before it ran between two polls") \
                    + " (not observed)"
            out.append(self._event("requeued", job.job_id, when, reason=reason))
            memory.restarts = job.restarts
            memory.running_start = None
            memory.preempted = False
        runs = job.phase == "running" and job.state != "COMPLETING" and bool(job.allocation)
        if runs and job.start is not None and job.start != memory.running_start:
            if memory.running_start is not None:  # a requeue we did not see in between
                out.append(self._event("requeued", job.job_id, job.start,
                                       reason="requeued by Slurm (between polls)"))
            memory.running_start = job.start
            memory.preempted = False
            out.append(self._event("started", job.job_id, job.start,
                                   allocation=[{"node": n, "gpu_index": i, "fraction": 1.0}
                                               for n, i in job.allocation],
                                   **self._attributes(job)))
        elif job.phase == "ended":
            out.extend(self._ended(job, memory, now, stats, first_seen))
        return out

    def _ended(self, job: SlurmJob, memory: JobMemory, now: float,
               stats: StepStats, first_seen: bool) -> list[Record]:
        when = job.end or now
        started_unseen = (memory.running_start is None and not memory.preempted
                          and job.start is not None and job.end is not None
                          and job.end > job.start)
        note = ""
        if started_unseen and first_seen and self.last_poll is None:
            stats.before_bridge += 1
            note = "; not observed by the bridge (started before it ran)"
        elif started_unseen:
            stats.start_unseen += 1
            note = (f"; ran {job.end - job.start:.0f} s between two polls "  # type: ignore[operator]
                    "(allocation not observed)")
        out: list[Record] = []
        if job.state == "PREEMPTED":
            if not memory.preempted:
                if memory.running_start is not None:
                    out.append(self._event("preempted", job.job_id, when,
                                           reason="preempted by Slurm"))
                memory.preempted = True
                memory.running_start = None
                if job.requeue:
                    # a requeue shows as PENDING with a higher restart count; a job
                    # still PREEMPTED at the next poll is not coming back
                    return out
            out.append(self._event("cancelled", job.job_id, when,
                                   reason="preempted and not requeued" + note))
        elif job.state == "COMPLETED":
            out.append(self._event("finished", job.job_id, when,
                                   reason=("completed" + note) if note else None))
        elif job.state == "CANCELLED":
            ran = memory.running_start is not None or started_unseen
            out.append(self._event("cancelled", job.job_id, when,
                                   reason="cancelled" + (note if ran else " before it started")))
        else:
            exit_code = f" (exit code {job.exit_code})" if job.exit_code else ""
            out.append(self._event("failed", job.job_id, when,
                                   reason=f"{job.state.lower()}{exit_code}{note}"))
        memory.ended = True
        memory.running_start = None
        return out

    # -- records -------------------------------------------------------------------

    def _attributes(self, job: SlurmJob) -> dict[str, Any]:
        return job_attributes(self.mapping, job)

    def _event(self, event: str, job_id: str, when: float, **fields: Any) -> Record:
        record: Record = {"v": CONTRACT_VERSION, "type": "job", "time": rfc3339(when),
                          "event": event, "job_id": self.prefix + job_id}
        record.update((k, v) for k, v in fields.items() if v is not None)
        return record

    def _inventory(self, nodes: list[SlurmNode], now: float,
                   stats: StepStats) -> list[Record]:
        out = []
        for node in nodes:
            if node.gpus <= 0 or not self._counts.fits(node.name, node.gpus):
                continue
            body = node_record(self.mapping, node)
            text = json.dumps(body, sort_keys=True)
            last = self.nodes.get(node.name)
            if last is not None and last[0] == text and now - last[1] < self.inventory_refresh_s:
                continue
            self.nodes[node.name] = (text, now)
            out.append({"v": CONTRACT_VERSION, "type": "inventory", "time": rfc3339(now),
                        **body})
        return out


def job_attributes(m: Mapping, job: SlurmJob) -> dict[str, Any]:
    """The contract's job attributes of a Slurm job, through the mapping."""
    card = m.card_type(job.gpu_type)
    return {
        "team": m.team(account=job.account),
        "user": job.user,
        "queue": m.queue(partition=job.partition, qos=job.qos),
        "pool": m.pool(partition=job.partition),
        "priority": m.priority(qos=job.qos, native=job.priority),
        "job_type": m.job_type(name=job.name, qos=job.qos, partition=job.partition,
                               account=job.account),
        "gpus": job.gpus,
        "card_type": card,
        "gpu_mem_mib": m.card_memory(card),
        "preemptible": m.preemptible(qos=job.qos),
    }


def node_record(m: Mapping, node: SlurmNode) -> Record:
    """The inventory fields of a Slurm node (everything but the envelope)."""
    card = m.card_type(node.gpu_type) or "unknown"
    flags = set(node.flags)
    down = node.state in _DOWN_STATES or "NOT_RESPONDING" in flags or "FAIL" in flags
    drained = bool(flags & {"DRAIN", "DRAINED", "DRAINING", "MAINTENANCE", "REBOOT_REQUESTED",
                            "REBOOT_ISSUED", "POWERED_DOWN", "POWER_DOWN"}) \
        or node.state in ("drained", "draining", "maint")
    unhealthy = sorted(i for i in node.gres_drained if 0 <= i < node.gpus)
    health = "down" if down else ("degraded" if unhealthy else "ok")
    labels = {"slurm_state": "+".join([node.state.upper(), *sorted(flags)]),
              "slurm_partitions": ",".join(node.partitions)}
    if node.reason:
        labels["slurm_reason"] = node.reason
    if node.gpu_type:
        labels["slurm_gres_type"] = node.gpu_type
    record: Record = {
        "node": node.name,
        "pool": m.pool(partition=node.partitions[0] if node.partitions else None)
        or "default",
        "card_type": card,
        "gpu_count": node.gpus,
        "gpu_mem_mib": m.card_memory(card) or 0.0,
        "labels": labels,
        "schedulable": not down and not drained,
        "health": health,
    }
    if unhealthy:
        record["unhealthy_gpus"] = unhealthy
    return record
