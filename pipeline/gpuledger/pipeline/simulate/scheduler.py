"""Discrete-event model of a gang scheduler with quotas, borrowing and preemption.

The model is a loop over job and cluster *events* (never over telemetry samples). Times
are integer seconds since the simulation origin (the start of the warm-up).

Policy, in the order a scheduling pass applies it:

1. **Passes.** A pass over a pool runs on the scheduler tick (every
   ``schedule_interval_s``) after something changed in that pool: a submission, an
   attempt ending, a preemption, a node or GPU coming back. So every attempt waits at
   least until the next tick, and queues form when the pool is busy.
2. **Order.** Pending jobs of the pool are taken by priority (high first), then by the
   time they entered the queue (submission or requeue), then by job id.
3. **Gang placement.** A job gets all its GPUs at once or none. A job of at most one
   node's GPUs goes on a single node; a bigger one takes whole, completely free nodes of
   one card type (``gpus / gpus_per_node`` of them). Fractional jobs (a share of one
   GPU, in quarters) may share a GPU with other fractional jobs.
4. **Best fit.** A single-node job goes to the compatible node with the *fewest* free
   whole GPUs that still fits it (ties: lowest node name), on that node's lowest free
   GPU indices. A fractional job goes to the GPU with the least free share that fits
   (partially used GPUs first), then the node with the fewest free GPUs. A multi-node
   job uses the card type with the fewest completely free nodes that still suffice,
   and the lowest-named of those nodes. Drained, down and unhealthy capacity is never
   used.
5. **Quota and borrowing.** Each team has a quota of whole GPUs per pool. A job whose
   start takes its team's usage in the pool above the quota still starts when capacity
   is idle, and its ``started`` event says ``borrowed: true``.
6. **Preemption.** When a job that is within its team's quota cannot be placed, the
   scheduler looks for victims in the same pool: attempts of other teams that run on
   borrowed capacity, and attempts of preemptible queues with a lower priority.
   Victims are taken cheapest first (lowest priority, then least work lost since the
   last checkpoint times GPUs) until the job fits, and victims that turn out
   unnecessary are spared. Each victim gets ``preempted`` (with the reason) and
   ``requeued`` at the same instant and re-enters the queue; a checkpointable job
   resumes from its last checkpoint, any other job restarts from the beginning.
7. **Reservation.** A job that has waited longer than ``reserve_after_minutes`` and
   still cannot start reserves the node(s) with the most free GPUs for the rest of the
   pass, so lower-ordered jobs cannot keep it starving by taking those nodes.

Attempts end when their work is done (``finished``), or earlier when the job fails or
is cancelled by its user. Pending jobs are cancelled when their user loses patience.

Incidents (``faults``) happen at random times in the emitted span: a node *drained* for
maintenance (running attempts are preempted and requeued, the node is unschedulable for
the drain time), a GPU hit by *XID 79* (its attempts fail; the GPU is unhealthy until
repaired; the node is ``degraded``) and a node going *down* (its attempts fail; the node
sends no telemetry until it is back).

Rules: every step above that a replay may change (placement, borrowing, reclaim,
priority preemption, back-fill) is switched by :class:`Rules`; the defaults are the
policy described here. ``gpuledger whatif`` (``pipeline/advisor``) replays history
through this model under other rules.

Warm-up: the model runs from the origin, ``warmup_hours`` before the emitted span
starts, so the cluster is loaded from the first emitted minute. Only events at or after
the span start are emitted. Every job that is pending at the span start gets a
``submitted`` event at the span start, and every job running at the span start gets a
``submitted`` and a ``started`` event (with its current allocation and borrowed flag)
at the span start, before any other event of that instant. Their earlier history
(submission time, queue wait, checkpoints) is not emitted.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gpuledger.pipeline.simulate.cluster import ClusterSpec
from gpuledger.pipeline.simulate.layout import Layout
from gpuledger.pipeline.simulate.workload import Job

WHOLE = 4  # quarters in a whole GPU
MAX_VICTIMS = 64
NO_END = 2**62

# Heap event kinds, in the order they are handled at the same instant.
END, FAULT, CANCEL, ARRIVE, TICK = range(5)
# Fault kinds.
DRAIN, UNDRAIN, DOWN, UP, GPU_FAIL, REPAIR = range(6)

PENDING, RUNNING, ENDED = 1, 2, 3


@dataclass
class Attempt:
    """One run of a job on a set of GPUs."""

    job: int
    number: int
    start_s: int
    gpus: np.ndarray  # global GPU indices
    units: int  # quarters held on each GPU
    borrowed: bool


@dataclass(frozen=True)
class RunningInPool:
    """The attempts running in one pool, as arrays aligned on ``job`` (a victim search
    reads them whole; they are gathered again after an attempt starts or ends there)."""

    job: np.ndarray
    start_s: np.ndarray
    borrowed: np.ndarray
    team: np.ndarray  # the team's number (``Scheduler._team_number``)
    priority: np.ndarray
    preemptible: np.ndarray
    checkpoint_s: np.ndarray
    demand_units: np.ndarray
    gpu_class: np.ndarray  # the (pool, card) class of every GPU held; -1: more than one


@dataclass(frozen=True)
class JobEvent:
    """One emitted scheduler event."""

    time_s: int
    order: int
    job: int
    event: str
    borrowed: bool | None = None
    gpus: tuple[int, ...] | None = None
    units: int = WHOLE
    reason: str | None = None


@dataclass(frozen=True)
class NodeState:
    """One emitted inventory change of a node."""

    time_s: int
    node: int
    schedulable: bool
    health: str
    unhealthy_gpus: tuple[int, ...]


@dataclass
class Segments:
    """Who held which GPU when: one row per attempt and GPU (job -1: outside process)."""

    job: np.ndarray
    attempt: np.ndarray
    gpu: np.ndarray
    units: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    activity: np.ndarray  # outside processes only (NaN for jobs)


@dataclass
class Schedule:
    """The outcome of a scheduler run: emitted events and GPU occupancy."""

    start_s: int
    end_s: int
    events: list[JobEvent]
    inventory: list[NodeState]
    segments: Segments
    down: list[tuple[int, int, int]]  # node, from, to
    unhealthy: list[tuple[int, int, int]]  # gpu, from, to
    stats: dict[str, int] = field(default_factory=dict)


class Placement(Protocol):
    """Where a job goes: GPU indices for ``job`` given free quarters per GPU, or None.

    ``blocked`` marks nodes reserved for a starving job during this pass. Implementations
    read the scheduler's state (layout, compatibility masks) but never change it."""

    def place(
        self, sched: Scheduler, job: Job, free: np.ndarray, blocked: np.ndarray
    ) -> list[int] | None: ...


@dataclass(frozen=True)
class Rules:
    """The switchable parts of the policy (module docstring); defaults: as described."""

    placement: Placement | None = None  # None: best fit (step 4)
    borrow: bool = True  # start over-quota jobs on idle capacity (step 5); off: fixed quota
    reclaim: bool = True  # preempt other teams' borrowed attempts (step 6)
    preempt_priority: bool = True  # preempt lower-priority preemptible attempts (step 6)
    checkpointable_victims_only: bool = False  # spare victims that cannot resume
    backfill: bool = True  # off: a pass stops at the first job that cannot start


class Scheduler:
    """Runs the event loop; see the module docstring for the policy."""

    def __init__(
        self,
        spec: ClusterSpec,
        layout: Layout,
        jobs: list[Job],
        *,
        seed: int,
        start_s: int,
        end_s: int,
        rules: Rules | None = None,
        pinned: dict[int, list[int]] | None = None,
    ) -> None:
        """``pinned``: jobs already running at ``start_s`` on these GPUs (a replay's
        initial state); they start there at ``start_s`` instead of arriving."""
        self.spec = spec
        self.rules = rules if rules is not None else Rules()
        self.pinned = dict(pinned or {})
        self.layout = layout
        self.jobs = jobs
        self.start_s = start_s
        self.end_s = end_s
        self.rng = np.random.default_rng([seed, 2])
        n_nodes, n_gpus = layout.node_count, layout.gpu_count
        self.free = np.full(n_gpus, WHOLE, dtype=np.int64)
        self.gpu_ok = np.ones(n_gpus, dtype=bool)
        self.drained = np.zeros(n_nodes, dtype=bool)
        self.node_down = np.zeros(n_nodes, dtype=bool)
        self.status = [0] * len(jobs)
        self.done = [0] * len(jobs)
        self.attempts = [0] * len(jobs)
        self.queued = [0] * len(jobs)
        self.running: dict[int, Attempt] = {}
        self.pending: dict[str, set[int]] = {p: set() for p in spec.pools}
        self.usage: dict[tuple[str, str], int] = {}
        self.quota: dict[tuple[str, str], int] = {
            (t.name, p): WHOLE * t.quota.get(p, 0) for t in spec.teams for p in spec.pools
        }
        self.reserve_after_s = round(spec.reserve_after_minutes * 60)
        self.heap: list[tuple[int, int, int, int, int]] = []
        self.counter = 0
        self.log: list[JobEvent] = []
        self.inventory: list[NodeState] = []
        self.seg_rows: list[tuple[int, int, int, int, int, int]] = []
        self.down: dict[int, int] = {}
        self.down_done: list[tuple[int, int, int]] = []
        self.unhealthy: dict[int, int] = {}
        self.unhealthy_done: list[tuple[int, int, int]] = []
        self.dirty: set[str] = set()
        self.tick_at: int | None = None
        self.snapshot: list[JobEvent] | None = None
        self.stats = {"passes": 0, "preemptions": 0, "reservations": 0}
        self._cap: dict[tuple[str, str | None], tuple[int, int, dict[str, int]]] = {}
        # victim searches read the running attempts of a pool as arrays: each job's own
        # figures once, each attempt's when it starts, gathered per pool when asked
        self._team_number: dict[str, int] = {}
        self._job_figures = self._figures_of(jobs)
        self._started_s = np.zeros(len(jobs), dtype=np.int64)
        self._borrowing = np.zeros(len(jobs), dtype=bool)
        self._held_class = np.full(len(jobs), -1, dtype=np.int64)
        self._running_by_pool: dict[str, set[int]] = {}
        self._in_pool: dict[str, RunningInPool] = {}
        classes: dict[tuple[str, str], int] = {}
        node_class = np.array([classes.setdefault(pc, len(classes)) for pc in zip(
            layout.node_pool, layout.node_card, strict=True)], dtype=np.int64)
        self._gpu_class = node_class[layout.gpu_node]
        self._node_class = node_class
        self._compat_class: dict[tuple[str, str | None], np.ndarray] = {}
        """Per job kind, which GPU classes it may use, and a last entry (False) that the
        class -1 of an attempt on several classes reads (``_on_usable_gpus``)."""
        self._no_room: set[tuple[object, ...]] = set()
        """Job shapes whose preemption search failed since the state last changed: the
        search is pure, and in a long queue most waiting jobs repeat a few shapes (it
        made planning super-linear: 200 h took 81 s). Under every placement policy too:
        each reads only the job's shape (pool, card type, GPUs, units) and the state."""
        self._compat_node: dict[tuple[str, str | None], np.ndarray] = {}
        self._compat_gpu: dict[tuple[str, str | None], np.ndarray] = {}
        self._cards: dict[tuple[str, str | None], list[tuple[str, int]]] = {}
        for job in jobs:
            self._compat(job.pool, job.card_type)

    # --- setup ----------------------------------------------------------------------

    def _compat(self, pool: str, card: str | None) -> None:
        key = (pool, card)
        if key in self._compat_node:
            return
        lay = self.layout
        node_ok = np.array(
            [
                p == pool and card in (None, c)
                for p, c in zip(lay.node_pool, lay.node_card, strict=True)
            ],
            dtype=bool,
        )
        self._compat_node[key] = node_ok
        self._compat_gpu[key] = node_ok[lay.gpu_node]
        by_class = np.zeros(int(self._node_class.max(initial=-1)) + 2, dtype=bool)
        by_class[self._node_class[node_ok]] = True
        self._compat_class[key] = by_class
        cards: dict[str, int] = {}
        for n in np.flatnonzero(node_ok):
            cards.setdefault(lay.node_card[n], int(lay.node_gpus[n]))
        self._cards[key] = sorted(cards.items())

    def _push(self, t: int, kind: int, a: int, b: int = 0) -> None:
        self.counter += 1
        heapq.heappush(self.heap, (t, kind, self.counter, a, b))

    def _emit(
        self,
        t: int,
        job: int,
        event: str,
        *,
        borrowed: bool | None = None,
        gpus: tuple[int, ...] | None = None,
        units: int = WHOLE,
        reason: str | None = None,
    ) -> None:
        self.log.append(JobEvent(t, len(self.log), job, event, borrowed, gpus, units, reason))

    # --- main loop --------------------------------------------------------------------

    def add_fault(self, t: int, kind: int, target: int) -> None:
        """Schedule an incident (``DRAIN``/``UNDRAIN``/``DOWN``/``UP`` of a node,
        ``GPU_FAIL``/``REPAIR`` of a global GPU index) at ``t``, e.g. one a replay saw."""
        self._push(t, FAULT, kind, target)

    def run(self) -> Schedule:
        """Simulate from the origin to the end of the span."""
        for j, gpus in sorted(self.pinned.items()):
            self.status[j] = PENDING
            self._start(j, gpus, self.jobs[j].submit_s)
        for job in self.jobs:
            if job.index in self.pinned:
                continue
            self._push(job.submit_s, ARRIVE, job.index)
            if job.patience_s is not None:
                self._push(job.submit_s + job.patience_s, CANCEL, job.index)
        self._plan_faults()
        while self.heap and self.heap[0][0] < self.end_s:
            t, kind, _, a, b = heapq.heappop(self.heap)
            if self.snapshot is None and t >= self.start_s:
                self._take_snapshot()
            if kind == END:
                self._on_end(t, a, b)
            elif kind == FAULT:
                self._on_fault(t, a, b)
            elif kind == CANCEL:
                self._on_cancel(t, a)
            elif kind == ARRIVE:
                self._on_arrive(t, a)
            else:
                self._on_tick(t)
        if self.snapshot is None:
            self._take_snapshot()
        for j in sorted(self.running):
            self._close(j, self.end_s)
        return self._result()

    def _take_snapshot(self) -> None:
        """Synthetic events at the span start for jobs pending or running then."""
        t = self.start_s
        out: list[JobEvent] = []
        for j in range(len(self.jobs)):
            if self.status[j] == PENDING:
                out.append(JobEvent(t, -1, j, "submitted"))
            elif self.status[j] == RUNNING:
                a = self.running[j]
                out.append(JobEvent(t, -1, j, "submitted"))
                out.append(
                    JobEvent(
                        t, -1, j, "started", a.borrowed, tuple(int(g) for g in a.gpus), a.units
                    )
                )
        self.snapshot = out
        for n in range(self.layout.node_count):
            self._record_node(t, n)

    def _result(self) -> Schedule:
        assert self.snapshot is not None
        emitted = [e for e in self.log if e.time_s >= self.start_s]
        emitted.sort(key=lambda e: (e.time_s, e.order))
        events = self.snapshot + emitted
        inventory = sorted(self.inventory, key=lambda s: (s.time_s, s.node))
        outside = place_outside(
            self.spec,
            self.layout,
            self.seg_rows,
            self.rng,
            self.start_s,
            self.end_s,
            self._faulted_nodes(),
        )
        rows = self.seg_rows
        acts = [float("nan")] * len(rows)
        for gpu, t0, t1, act in outside:
            rows.append((-1, 0, gpu, WHOLE, t0, t1))
            acts.append(act)
        arr = np.array(rows, dtype=np.int64).reshape(-1, 6)
        segments = Segments(
            job=arr[:, 0],
            attempt=arr[:, 1],
            gpu=arr[:, 2],
            units=arr[:, 3],
            start_s=arr[:, 4],
            end_s=arr[:, 5],
            activity=np.array(acts, dtype=np.float64),
        )
        down = self.down_done + [(n, t0, NO_END) for n, t0 in sorted(self.down.items())]
        unhealthy = self.unhealthy_done + [
            (g, t0, NO_END) for g, t0 in sorted(self.unhealthy.items())
        ]
        stats = dict(self.stats)
        stats["jobs"] = len(self.jobs)
        stats["events"] = len(events)
        return Schedule(
            self.start_s, self.end_s, events, inventory, segments, down, unhealthy, stats
        )

    # --- event handlers ---------------------------------------------------------------

    def _on_arrive(self, t: int, j: int) -> None:
        job = self.jobs[j]
        self._emit(t, j, "submitted")
        self.status[j] = PENDING
        self.queued[j] = t
        self.pending[job.pool].add(j)
        self._touch(job.pool, t)

    def _on_cancel(self, t: int, j: int) -> None:
        if self.status[j] != PENDING:
            return
        job = self.jobs[j]
        self.pending[job.pool].discard(j)
        self.status[j] = ENDED
        self._emit(t, j, "cancelled", reason="cancelled by user while pending")

    def _on_end(self, t: int, j: int, number: int) -> None:
        if self.status[j] != RUNNING or self.attempts[j] != number:
            return  # a stale end of a preempted or failed attempt
        job = self.jobs[j]
        self._close(j, t)
        self.status[j] = ENDED
        reason = {"failed": "exit code 1", "cancelled": "cancelled by user"}.get(job.outcome)
        self._emit(t, j, job.outcome, reason=reason)
        self._touch(job.pool, t)

    def _on_tick(self, t: int) -> None:
        self.tick_at = None
        pools = [p for p in self.spec.pools if p in self.dirty]
        self.dirty.clear()
        for pool in pools:
            self._pass(pool, t)

    def _touch(self, pool: str, t: int) -> None:
        """Mark ``pool`` for a pass at the next tick."""
        self.dirty.add(pool)
        if self.tick_at is None:
            interval = self.spec.schedule_interval_s
            self.tick_at = (t // interval + 1) * interval
            self._push(self.tick_at, TICK, 0)

    # --- attempts -----------------------------------------------------------------------

    def _start(self, j: int, gpus: list[int], t: int) -> None:
        job = self.jobs[j]
        key = (job.team, job.pool)
        used = self.usage.get(key, 0)
        borrowed = used + job.demand_units > self.quota[key]
        self.usage[key] = used + job.demand_units
        idx = np.array(gpus, dtype=np.int64)
        self.free[idx] -= job.units
        self.attempts[j] += 1
        self.status[j] = RUNNING
        self.pending[job.pool].discard(j)
        self.running[j] = Attempt(j, self.attempts[j], t, idx, job.units, borrowed)
        self._started_s[j], self._borrowing[j] = t, borrowed
        held = self._gpu_class[idx]
        self._held_class[j] = held[0] if held.size and (held == held[0]).all() else -1
        self._running_by_pool.setdefault(job.pool, set()).add(j)
        self._in_pool.pop(job.pool, None)
        remaining = max(1, job.end_work_s - self.done[j])
        self._push(t + remaining, END, j, self.attempts[j])
        self._emit(t, j, "started", borrowed=borrowed, gpus=tuple(gpus), units=job.units)
        self._state_changed()

    def _close(self, j: int, t: int) -> Attempt:
        """End the running attempt of job ``j`` at ``t``: free GPUs, log checkpoints."""
        a = self.running.pop(j)
        job = self.jobs[j]
        self._running_by_pool[job.pool].discard(j)
        self._in_pool.pop(job.pool, None)
        self.free[a.gpus] += a.units
        self.usage[(job.team, job.pool)] -= job.demand_units
        for g in a.gpus.tolist():
            self.seg_rows.append((j, a.number, g, a.units, a.start_s, t))
        if job.checkpoint_s:
            for k in range(1, _checkpoints_before(a.start_s, t, job.checkpoint_s) + 1):
                self._emit(a.start_s + k * job.checkpoint_s, j, "checkpointed")
        self._state_changed()
        return a

    def _preempt(self, j: int, t: int, reason: str) -> None:
        a = self._close(j, t)
        job = self.jobs[j]
        if job.checkpoint_s:
            self.done[j] += _checkpoints_before(a.start_s, t, job.checkpoint_s) * job.checkpoint_s
        self._emit(t, j, "preempted", borrowed=a.borrowed, reason=reason)
        self._emit(t, j, "requeued", reason="requeued after preemption")
        self.status[j] = PENDING
        self.queued[j] = t
        self.pending[job.pool].add(j)
        self.stats["preemptions"] += 1
        self._touch(job.pool, t)

    def _fail(self, j: int, t: int, reason: str) -> None:
        self._close(j, t)
        self.status[j] = ENDED
        self._emit(t, j, "failed", reason=reason)
        self._touch(self.jobs[j].pool, t)

    # --- scheduling pass --------------------------------------------------------------

    def _pass(self, pool: str, t: int) -> None:
        self.stats["passes"] += 1
        jobs = self.jobs
        order = sorted(self.pending[pool], key=lambda j: (-jobs[j].priority, self.queued[j], j))
        blocked = np.zeros(self.layout.node_count, dtype=bool)
        self._state_changed()
        for j in order:
            if self.status[j] != PENDING:
                continue
            job = jobs[j]
            if not self.rules.borrow and not self._within_quota(job):
                continue  # fixed quota: waits until its team's usage allows it
            gpus = self._place(job, self.free, blocked) if self._may_fit(job, blocked) else None
            if gpus is None and self._within_quota(job):
                gpus = self._preempt_for(j, blocked, t)
            if gpus is None:
                if t - self.queued[j] >= self.reserve_after_s:
                    self._reserve(job, blocked)
                if not self.rules.backfill:
                    break
                continue
            self._start(j, gpus, t)

    def _state_changed(self) -> None:
        """Free GPUs, running attempts or reservations changed: forget what was derived."""
        self._cap.clear()
        self._no_room.clear()

    def _within_quota(self, job: Job) -> bool:
        key = (job.team, job.pool)
        return self.usage.get(key, 0) + job.demand_units <= self.quota[key]

    def _usable(self, key: tuple[str, str | None], blocked: np.ndarray) -> np.ndarray:
        node_open = ~(self.drained | self.node_down | blocked)
        mask: np.ndarray = self._compat_gpu[key] & self.gpu_ok & node_open[self.layout.gpu_node]
        return mask

    def _node_whole(self, usable: np.ndarray, free: np.ndarray) -> np.ndarray:
        whole = usable & (free == WHOLE)
        counts: np.ndarray = np.bincount(
            self.layout.gpu_node[whole], minlength=self.layout.node_count
        )
        return counts

    def _may_fit(self, job: Job, blocked: np.ndarray) -> bool:
        """Cheap necessary condition for ``_place``, cached until the state changes."""
        key = (job.pool, job.card_type)
        cap = self._cap.get(key)
        if cap is None:
            usable = self._usable(key, blocked)
            max_units = int(self.free[usable].max()) if usable.any() else 0
            node_whole = self._node_whole(usable, self.free)
            max_whole = int(node_whole.max())
            full: dict[str, int] = {}
            for card, per_node in self._cards[key]:
                card_nodes = self._card_nodes(job.pool, card)
                full[card] = int(np.count_nonzero(card_nodes & (node_whole == per_node)))
            cap = (max_units, max_whole, full)
            self._cap[key] = cap
        max_units, max_whole, full = cap
        if job.units < WHOLE:
            return max_units >= job.units
        if any(job.gpus <= n for _, n in self._cards[key]):
            return max_whole >= job.gpus
        return any(
            job.gpus % n == 0 and full[card] >= job.gpus // n for card, n in self._cards[key]
        )

    def _card_nodes(self, pool: str, card: str) -> np.ndarray:
        self._compat(pool, card)
        return self._compat_node[(pool, card)]

    def _place(self, job: Job, free: np.ndarray, blocked: np.ndarray) -> list[int] | None:
        """Placement of ``job`` given free quarters per GPU (the rules' policy), or None."""
        if self.rules.placement is not None:
            return self.rules.placement.place(self, job, free, blocked)
        return self.best_fit(job, free, blocked)

    def best_fit(self, job: Job, free: np.ndarray, blocked: np.ndarray) -> list[int] | None:
        """Best-fit placement of ``job`` given free quarters per GPU, or None."""
        lay = self.layout
        key = (job.pool, job.card_type)
        usable = self._usable(key, blocked)
        if job.units < WHOLE:
            cand = np.flatnonzero(usable & (free >= job.units))
            if cand.size == 0:
                return None
            node_whole = self._node_whole(usable, free)
            pick = np.lexsort((cand, node_whole[lay.gpu_node[cand]], free[cand]))[0]
            return [int(cand[pick])]
        node_whole = self._node_whole(usable, free)
        if any(job.gpus <= n for _, n in self._cards[key]):
            fits = self._compat_node[key] & (node_whole >= job.gpus)
            if not fits.any():
                return None
            node = int(np.argmin(np.where(fits, node_whole, np.iinfo(np.int64).max)))
            first = int(lay.node_first_gpu[node])
            span = slice(first, first + int(lay.node_gpus[node]))
            local = np.flatnonzero(usable[span] & (free[span] == WHOLE))[: job.gpus]
            return [first + int(i) for i in local]
        best: tuple[int, np.ndarray] | None = None
        for card, per_node in self._cards[key]:
            if job.gpus % per_node:
                continue
            need = job.gpus // per_node
            full = np.flatnonzero(self._card_nodes(job.pool, card) & (node_whole == per_node))
            if full.size >= need and (best is None or full.size < best[0]):
                best = (int(full.size), full[:need])
        if best is None:
            return None
        out: list[int] = []
        for node in best[1].tolist():
            first = int(lay.node_first_gpu[node])
            out.extend(range(first, first + int(lay.node_gpus[node])))
        return out

    def _reserve(self, job: Job, blocked: np.ndarray) -> None:
        """Hold the most promising node(s) for a starving job for the rest of the pass."""
        if job.units < WHOLE:
            return
        shape = ("reserve", job.pool, job.card_type, job.gpus)
        if shape in self._no_room:
            return  # the same shape found nothing to hold since the state last changed
        if not self._hold(job, blocked):
            self._no_room.add(shape)

    def _hold(self, job: Job, blocked: np.ndarray) -> bool:
        """Block the node(s) ``_reserve`` picks; False when there are none to block."""
        key = (job.pool, job.card_type)
        usable = self._usable(key, blocked)
        node_whole = self._node_whole(usable, self.free)
        open_nodes = self._compat_node[key] & ~(self.drained | self.node_down | blocked)
        if any(job.gpus <= n for _, n in self._cards[key]):
            cand = np.flatnonzero(open_nodes & (self.layout.node_gpus >= job.gpus))
            need = 1
        else:
            options = [(c, n) for c, n in self._cards[key] if job.gpus % n == 0]
            if not options:
                return False
            card, per_node = max(
                options,
                key=lambda o: int(node_whole[self._card_nodes(job.pool, o[0])].sum()),
            )
            cand = np.flatnonzero(open_nodes & self._card_nodes(job.pool, card))
            need = job.gpus // per_node
        if cand.size < need:
            return False
        ranked = cand[np.argsort(-node_whole[cand], kind="stable")][:need]
        blocked[ranked] = True
        self.stats["reservations"] += 1
        self._state_changed()
        return True

    def _preempt_for(self, j: int, blocked: np.ndarray, t: int) -> list[int] | None:
        """Free room for within-quota job ``j`` by preempting cheaper attempts."""
        job = self.jobs[j]
        shape = (job.pool, job.card_type, job.team, job.priority, job.gpus, job.units)
        if shape in self._no_room:
            return None  # the same search failed since the state last changed
        preempted = self.stats["preemptions"]
        gpus = self._search_victims(job, blocked, t)
        if gpus is None and self.stats["preemptions"] == preempted:
            self._no_room.add(shape)
        return gpus

    def _search_victims(self, job: Job, blocked: np.ndarray, t: int) -> list[int] | None:
        """Preempt the cheapest set of attempts that makes room for ``job``; None when
        there is none. Depends on the job's shape and the state alone."""
        run = self._running_in(job.pool)
        if run is None:
            return None
        rules = self.rules
        may = np.zeros(run.job.size, dtype=bool)
        if rules.reclaim:
            may |= run.borrowed & (run.team != self._team_number.get(job.team, -1))
        if rules.preempt_priority:
            may |= run.preemptible & (run.priority < job.priority)
        if rules.checkpointable_victims_only:
            may &= run.checkpoint_s > 0
        may &= self._on_usable_gpus(run, (job.pool, job.card_type))
        which = np.flatnonzero(may)
        if which.size == 0:
            return None
        start, every = run.start_s[which], run.checkpoint_s[which]
        cost = (t - (start + _checkpoints_before_each(start, t, every) * every)
                ) * run.demand_units[which]
        # cheapest first: lower priority, less work lost, started later, then the job
        order = which[np.lexsort((run.job[which], -start, cost, run.priority[which]))]
        victims = [self.running[j] for j in run.job[order[:MAX_VICTIMS]].tolist()]
        trial = self.free.copy()
        chosen: list[Attempt] = []
        fitted = False
        for a in victims:
            trial[a.gpus] += a.units
            chosen.append(a)
            if self._place(job, trial, blocked) is not None:
                fitted = True
                break
        if not fitted:
            return None
        for a in reversed(chosen[:-1]):
            trial[a.gpus] -= a.units
            if self._place(job, trial, blocked) is None:
                trial[a.gpus] += a.units
            else:
                chosen.remove(a)
        for a in chosen:
            if a.borrowed and self.jobs[a.job].team != job.team:
                reason = (
                    f"reclaimed borrowed capacity for job {job.job_id} "
                    f"(team {job.team} within quota)"
                )
            else:
                reason = f"preempted by higher-priority job {job.job_id} (queue {job.queue})"
            self._preempt(a.job, t, reason)
        return self._place(job, self.free, blocked)

    def _figures_of(self, jobs: list[Job]) -> dict[str, np.ndarray]:
        """Each job's team (numbered), priority, preemptibility, checkpoint interval and
        demand, as arrays indexed by job."""
        return {
            "team": np.array([self._team_number.setdefault(j.team, len(self._team_number))
                              for j in jobs], dtype=np.int64),
            "priority": np.array([j.priority for j in jobs], dtype=np.int64),
            "preemptible": np.array([j.preemptible for j in jobs], dtype=bool),
            "checkpoint_s": np.array([j.checkpoint_s for j in jobs], dtype=np.int64),
            "demand_units": np.array([j.demand_units for j in jobs], dtype=np.int64),
        }

    def _running_in(self, pool: str) -> RunningInPool | None:
        """The attempts running in ``pool`` as arrays (None: none runs there)."""
        if pool in self._in_pool:
            return self._in_pool[pool]
        running = self._running_by_pool.get(pool)
        if not running:
            return None
        ids = np.fromiter(running, dtype=np.int64, count=len(running))
        figures = self._job_figures
        run = RunningInPool(
            job=ids, start_s=self._started_s[ids], borrowed=self._borrowing[ids],
            team=figures["team"][ids], priority=figures["priority"][ids],
            preemptible=figures["preemptible"][ids],
            checkpoint_s=figures["checkpoint_s"][ids],
            demand_units=figures["demand_units"][ids], gpu_class=self._held_class[ids])
        self._in_pool[pool] = run
        return run

    def _on_usable_gpus(self, run: RunningInPool, key: tuple[str, str | None]) -> np.ndarray:
        """Which of ``run``'s attempts hold a GPU of the kind ``key`` asks for."""
        out: np.ndarray = self._compat_class[key][run.gpu_class]
        for i in np.flatnonzero(run.gpu_class < 0).tolist():  # GPUs of several classes
            out[i] = bool(self._compat_gpu[key][self.running[int(run.job[i])].gpus].any())
        return out

    # --- incidents ----------------------------------------------------------------------

    def _plan_faults(self) -> None:
        f = self.spec.faults
        span = self.end_s - self.start_s
        if span < 600:
            return
        nodes = self.rng.permutation(self.layout.node_count).tolist()
        plan = (
            [(DRAIN, UNDRAIN, f.drain_minutes)] * f.drains
            + [(GPU_FAIL, REPAIR, f.repair_minutes)] * f.gpu_failures
            + [(DOWN, UP, f.down_minutes)] * f.node_downs
        )
        for (begin, finish, minutes), node in zip(plan, nodes, strict=False):
            t0 = self.start_s + int(self.rng.uniform(0.05, 0.75) * span)
            t1 = t0 + round(minutes * 60)
            if begin == GPU_FAIL:
                target = int(self.layout.node_first_gpu[node]) + int(
                    self.rng.integers(int(self.layout.node_gpus[node]))
                )
            else:
                target = int(node)
            self._push(t0, FAULT, begin, target)
            self._push(t1, FAULT, finish, target)

    def _faulted_nodes(self) -> set[int]:
        out = {n for n, _, _ in self.down_done} | set(self.down)
        out |= {int(self.layout.gpu_node[g]) for g, _, _ in self.unhealthy_done}
        out |= {int(self.layout.gpu_node[g]) for g in self.unhealthy}
        out |= {s.node for s in self.inventory if not s.schedulable}
        return out

    def _jobs_on(self, gpus: np.ndarray) -> list[int]:
        hit = set(gpus.tolist())
        return sorted(j for j, a in self.running.items() if hit.intersection(a.gpus.tolist()))

    def _node_gpus(self, node: int) -> np.ndarray:
        first = int(self.layout.node_first_gpu[node])
        return np.arange(first, first + int(self.layout.node_gpus[node]))

    def _on_fault(self, t: int, kind: int, target: int) -> None:
        lay = self.layout
        node = int(lay.gpu_node[target]) if kind in (GPU_FAIL, REPAIR) else target
        name = lay.node_names[node]
        if kind == DRAIN:
            self.drained[node] = True
            for j in self._jobs_on(self._node_gpus(node)):
                self._preempt(j, t, f"node {name} drained for maintenance")
        elif kind == UNDRAIN:
            self.drained[node] = False
        elif kind == DOWN:
            self.node_down[node] = True
            self.down[node] = t
            for j in self._jobs_on(self._node_gpus(node)):
                self._fail(j, t, f"node {name} down: lost contact with the node")
        elif kind == UP:
            self.node_down[node] = False
            self.down_done.append((node, self.down.pop(node), t))
        elif kind == GPU_FAIL:
            self.gpu_ok[target] = False
            self.unhealthy[target] = t
            local = int(lay.gpu_local[target])
            for j in self._jobs_on(np.array([target])):
                self._fail(j, t, f"XID 79 (GPU has fallen off the bus) on {name} GPU {local}")
        else:
            self.gpu_ok[target] = True
            self.unhealthy_done.append((target, self.unhealthy.pop(target), t))
        self._state_changed()
        self._touch(lay.node_pool[node], t)
        if t >= self.start_s:
            self._record_node(t, node)

    def _record_node(self, t: int, node: int) -> None:
        gpus = self._node_gpus(node)
        bad = tuple(int(self.layout.gpu_local[g]) for g in gpus if not self.gpu_ok[g])
        if self.node_down[node]:
            health = "down"
        elif bad:
            health = "degraded"
        else:
            health = "ok"
        schedulable = not (self.drained[node] or self.node_down[node])
        self.inventory.append(NodeState(t, node, schedulable, health, bad))


def _checkpoints_before(start: int, t: int, every: int) -> int:
    """Checkpoints written strictly before ``t`` by an attempt started at ``start`` that
    checkpoints every ``every`` seconds (0: never)."""
    elapsed = t - start
    return max(0, (elapsed - 1) // every) if elapsed > 0 and every > 0 else 0


def _checkpoints_before_each(start: np.ndarray, t: int, every: np.ndarray) -> np.ndarray:
    """:func:`_checkpoints_before` for arrays of attempts (one attempt at a time stays in
    plain integers: numpy's fixed cost is ten times the arithmetic; the tests hold the two
    equal)."""
    elapsed = t - start
    return np.where((every > 0) & (elapsed > 0),
                    np.maximum(0, (elapsed - 1) // np.maximum(every, 1)), 0)


def place_outside(
    spec: ClusterSpec,
    layout: Layout,
    seg_rows: list[tuple[int, int, int, int, int, int]],
    rng: np.random.Generator,
    start_s: int,
    end_s: int,
    avoid_nodes: set[int],
) -> list[tuple[int, int, int, float]]:
    """Put each outside-the-scheduler process on a GPU that no job holds meanwhile.

    Returns ``(gpu, from, to, activity)`` rows. A process whose pool has no GPU free for
    its whole window (tried at a few start times) is left out.
    """
    by_gpu: dict[int, list[tuple[int, int]]] = {}
    for _, _, gpu, _, t0, t1 in seg_rows:
        by_gpu.setdefault(gpu, []).append((t0, t1))
    span = end_s - start_s
    taken: set[int] = set()
    out: list[tuple[int, int, int, float]] = []
    for proc in spec.outside_processes:
        length = min(round(proc.minutes * 60), max(60, span // 2))
        pool_gpus = [
            g
            for g in range(layout.gpu_count)
            if layout.node_pool[int(layout.gpu_node[g])] == proc.pool
            and int(layout.gpu_node[g]) not in avoid_nodes
            and g not in taken
        ]
        order = rng.permutation(len(pool_gpus)).tolist()
        placed = False
        for _ in range(12):
            t0 = start_s + int(rng.uniform(0.05, 0.6) * max(1, span - length))
            t1 = t0 + length
            for i in order:
                gpu = pool_gpus[i]
                if all(b <= t0 or a >= t1 for a, b in by_gpu.get(gpu, [])):
                    out.append((gpu, t0, t1, proc.activity))
                    taken.add(gpu)
                    placed = True
                    break
            if placed:
                break
    return out
