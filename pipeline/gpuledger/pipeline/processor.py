"""The processor: micro-batches of events in, one-minute facts out — one engine per instance.

Event time drives everything. Each batch (a dict of Polars frames, one per record
type) is validated, applied to state, and buffered; then every minute that the
*watermark* has passed is closed, turning into facts in one columnar pass.

**One engine, many partitions.** A processor instance runs one engine over all the
telemetry partitions it holds (``partitions.py``): one decode, one validation, one set
of scheduler and inventory state, one close pass per step for all of them. The
partition is a column of its state (samples, usage accumulators, buffered facts) and a
key of its output files, so one instance or several write the same files. Each
partition keeps its own *closed point*: a partition handed over from another instance
may be ahead of or behind this engine's, and a close pass closes each partition from its
own point (nothing is closed twice, nothing is skipped).

**Time is exact to the second** (``facts/minutes.py``): an attempt holding a GPU from
10:00:20 to 10:00:50 is half a GPU-minute in minute 10:00; a GPU-minute is split between
the jobs that held it, by share, and the rest (``facts/gpu_minutes.py``,
``facts/rollup.py``).

Windows, watermark and lateness (the documented policy, docs/kafka.md):

- The watermark is the newest telemetry time of the slowest node still reporting,
  minus ``allowed_lateness_s`` (default 120 s); before any telemetry has been seen
  (history imports) it is the newest scheduler/inventory time minus the same lateness.
  Minutes that end at or before the watermark close, oldest first.
- Out-of-order events inside open minutes are simply sorted in. Duplicated samples
  (same node, GPU, MIG instance, time) count once; duplicated job events (same job,
  event, time) are ignored; inventory records are states, so repeats are harmless.
  Job events that do not fit the job's life cycle are rejected with a reason.
- *Late* telemetry (its minute already closed) is never dropped silently: it is
  counted and written to the ``late_telemetry`` table, and the closed facts are not
  rewritten. Late job and inventory events still update state (so later minutes and
  job facts are right) and are counted.
- At the end of input (:meth:`Processor.flush`) every minute up to the newest event is
  closed and partial hours are written; running jobs go to the snapshot tables.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Collection
from datetime import UTC, datetime, timedelta
from typing import Protocol

import polars as pl

from gpuledger.contract.schema import RecordType
from gpuledger.pipeline import engines
from gpuledger.pipeline.bus import Batch
from gpuledger.pipeline.columns import TIME_DTYPE, conform
from gpuledger.pipeline.compaction import PART_TIME
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.counters import Counters
from gpuledger.pipeline.facts import job_usage, late_allocation, recommendations, rollup
from gpuledger.pipeline.facts import telemetry_minutes as telemetry
from gpuledger.pipeline.facts.cluster import cluster_facts, starts_window
from gpuledger.pipeline.facts.gpu_minutes import (
    GPU_KEYS,
    MINUTE_KEYS,
    allocation_per_gpu_minute,
    dense_gpu_rows,
    finish_gpu_rows,
    gpu_runs,
    job_minute_rows,
    job_rows_with_context,
    merged_occupancy,
)
from gpuledger.pipeline.facts.minutes import HOUR_MS, MINUTE_MS, clip_ms, ms, to_time
from gpuledger.pipeline.facts.spans import span_rows, split_runs
from gpuledger.pipeline.facts.telemetry_minutes import SampleKeys, prepare, sequence_gaps
from gpuledger.pipeline.partitions import Partitioning
from gpuledger.pipeline.state.inventory import InventoryBook
from gpuledger.pipeline.state.jobs import ATTEMPT_SCHEMA, OWNER, JobBook
from gpuledger.pipeline.tables import LATE_TELEMETRY, SORT_KEYS, TABLE_SCHEMAS
from gpuledger.pipeline.validate import REJECT_SCHEMA, validate
from gpuledger.pipeline.warehouse import Warehouse

log = logging.getLogger("gpuledger.processor")

PER_GPU_TABLES = ("gpu_minute", "gpu_span", "job_gpu")
CLUSTER_TABLES = ("frag_minute", "pending_minute", "blocked_minute", "job_attempts",
                  "preemptions", "recommendations")
HOURLY_TABLES = ("gpu_minute", "gpu_span", "frag_minute", "pending_minute", "blocked_minute",
                 "job_attempts", "job_gpu", "preemptions", "recommendations")
MERGED_TABLES = ("job_attempts", "job_gpu", "preemptions", "recommendations")
LOW_PRIORITY = 10
ACC_SCHEMA = job_usage.ACC_SCHEMA
PARTS_SCHEMA = pl.Schema([*ACC_SCHEMA.items(), ("shard", pl.Int64()), ("kind", pl.String())])
"""An attempt's accumulator rows as one partition sends them to the owner; ``shard`` is
the partition (the name is the wire format's)."""
REJECTS_SCHEMA = pl.Schema([*REJECT_SCHEMA.items(), ("partition", pl.Int64())])
OVERCOMMITTED = 1.0 + 1e-9
"""A GPU-minute whose allocated shares sum past this is overcommitted (counted)."""
DENSE_STEP = timedelta(hours=1)
"""The longest close step while telemetry is buffered (its samples are held in memory)."""
SPARSE_STEP = timedelta(hours=24)
"""The longest close step of a history without telemetry (no samples are held)."""
DENSE_TAIL = timedelta(minutes=15)
"""A close step with telemetry takes the minutes after it too when fewer than this would
be left for a step of their own (the end of an input an hour after where the last batch
closed, which the lateness left 2–3 minutes short of the hour: one pass, not a second one
for three minutes)."""

HourKey = tuple[str, datetime, int]


def conform_parts(parts: pl.DataFrame) -> pl.DataFrame:
    """Attempt parts in :data:`PARTS_SCHEMA` (an error when their columns are not it)."""
    return job_usage.conform(parts.select(PARTS_SCHEMA.names())).cast(
        dict(PARTS_SCHEMA))  # type: ignore[arg-type]


def _newest_by_node(tel: pl.DataFrame) -> pl.DataFrame:
    """Each node's newest sample time in ``tel`` (node, time)."""
    return engines.kept_frame(tel.lazy().group_by("node").agg(pl.col("time").max()))


def _run_key(table: str) -> list[str]:
    """What names a merged table's row across runs: its key and its time (``job_gpu``'s
    key has no time: a row an earlier run wrote with another end is another row)."""
    return list(dict.fromkeys([*SORT_KEYS[table], PART_TIME[table]]))


def _floor_minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


def _floor_step(t: datetime, minutes: int) -> datetime:
    """``t`` down to a multiple of ``minutes`` since midnight (1440 at most)."""
    day = t.replace(hour=0, minute=0, second=0, microsecond=0)
    if minutes <= 0:
        return _floor_minute(t)
    return day + timedelta(minutes=(t - day) // timedelta(minutes=minutes) * minutes)


def _floor_hour(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def _hour_of(hour_ms: int) -> datetime:
    return datetime.fromtimestamp(hour_ms / 1000, tz=UTC)


class FactListener(Protocol):
    """Something that follows the facts as windows close (the Prometheus exporter, the
    alert engine). Listeners are not part of the checkpointed state."""

    def facts(self, table: str, frame: pl.DataFrame) -> None:
        """Rows of ``table`` closed just now: a name in ``TABLE_SCHEMAS``, or
        ``job_gpu_minute`` (per job attempt, GPU and minute: share, activity, memory)."""

    def closed(self, processor: Processor, until: datetime) -> None:
        """Every minute before ``until`` is closed; ``processor`` may be read, not changed."""


class Processor:
    """Turns batches of contract events into warehouse facts."""

    def __init__(
        self,
        config: ProcessorConfig,
        warehouse: Warehouse,
        now: Callable[[], datetime] | None = None,
        telemetry_clock: bool = False,
        partitioning: Partitioning | None = None,
        spans: bool = True,
    ) -> None:
        """``telemetry_clock``: only telemetry moves the watermark (a live service, where
        scheduler events may be read ahead of telemetry); off, scheduler and inventory
        time moves it until telemetry is seen (history imports without telemetry).
        ``partitioning``: the telemetry partitions this engine holds (a Kafka service);
        without it, the engine holds the whole cluster as one partition, 0.
        ``spans``: GPUs without telemetry in a step are kept as spans of identical
        minutes (``facts/spans.py``); off, every GPU-minute is a row (the same facts,
        row by row: for tests and benchmarks)."""
        self.spans = spans
        self.config = config
        self.partitioning = partitioning
        self.telemetry_clock = telemetry_clock
        self.warehouse = warehouse
        self.counters = Counters()
        self._overcommit_said = False
        self._uncharged_said = 0
        self._rejected_said = 0
        self._late_said = (0, 0)
        self._ahead_said = False
        self._now = now or (lambda: datetime.now(UTC))
        self.inventory = InventoryBook()
        self.jobs = JobBook(config.windows.ended_job_memory_s)
        self.tel_parts: list[pl.DataFrame] = []
        """Telemetry of open minutes, folded per GPU-minute as batches arrived."""
        self.mem_parts: list[pl.DataFrame] = []
        """Job memory on GPUs of open minutes, per (minute, node, GPU, job)."""
        self.sample_keys = SampleKeys()
        self.acc = pl.DataFrame(schema=ACC_SCHEMA)
        self.part_closed: dict[int, datetime] = {}
        """Each held partition's closed point: every minute before it is closed."""
        self.started: datetime | None = None
        """The first minute of input (a partition added later starts there)."""
        self.max_telemetry_time: datetime | None = None
        self.max_other_time: datetime | None = None
        self.hour_parts: dict[HourKey, list[pl.DataFrame]] = {}
        self.rollup_parts: dict[tuple[datetime, int], list[pl.DataFrame]] = {}
        self.day_hourly: dict[tuple[datetime, int], dict[datetime, pl.DataFrame]] = {}
        self.late_parts: dict[tuple[datetime, int], list[pl.DataFrame]] = {}
        self.rejects: list[pl.DataFrame] = []
        self.last_free_blocks = pl.DataFrame(
            schema={"pool": pl.String, "card_type": pl.String, "largest_free_block": pl.Int64})
        self._seq_last: dict[tuple[int, str], int] = {}
        self.node_time: dict[str, datetime] = {}
        self.listeners: list[FactListener] = []
        # the attempt exchange (several instances): parts to send, and at the owner the
        # ended attempts waiting for parts, the parts received, the attempts done
        self.outbox: list[pl.DataFrame] = []
        self.waiting = pl.DataFrame(schema=ATTEMPT_SCHEMA)
        self.received = pl.DataFrame(schema=PARTS_SCHEMA)
        self.completed: dict[tuple[str, int], datetime] = {}
        self.running_parts: dict[int, pl.DataFrame] = {}
        self.flushed_shards: set[int] = set()
        """Partitions whose end-of-input flush the owner has seen (this run only)."""
        self.close_pending = False
        """Minutes the watermark has passed wait to be closed (catching up, see
        :meth:`advance`)."""
        self._last_close = time.monotonic()
        self._snapshot_at: float | None = None
        """When the running-attempt snapshot was last written (monotonic), if ever."""
        self._step: tuple[datetime, datetime] | None = None
        """The minutes the close step being written closed, while its tables are written
        by a run that holds every partition (:meth:`_drop_replaced`)."""
        self._step_written: set[tuple[str, datetime, int]] = set()
        """The (table, hour, partition) parts written since the step began (or the end
        of input's writes began), by a run that holds every partition."""
        self._run_from: datetime | None = None
        """Where this run's first close step started (a run holding every partition)."""
        self.pruned_to: datetime | None = None
        """The books hold no history closed before this (pruned behind the closed point):
        a partition started from the topic's start cannot be closed from these books."""
        self._earlier: dict[str, set[str]] = {}
        """Per merged table, the days earlier runs published parts of (as this run
        began)."""
        self._days_written: set[datetime] = set()
        """The days this run wrote ``gpu_daily`` rows of."""
        self._earlier_hourly: set[str] = set()
        """The days (``date=`` folders) earlier runs published ``gpu_hourly`` parts of."""
        self.keep_earlier_rows = False
        """Keep the merged rows earlier runs wrote in this run's time (``ingest`` going on
        past a stale point takes the time between as empty, but the attempts published
        from it are real)."""
        self._run_keys: dict[str, list[pl.DataFrame]] = {}
        """Per merged table, the keys and times of the rows this run wrote
        (:func:`_run_key`)."""
        if partitioning is None:
            self.part_closed = {}
        for table, schema in TABLE_SCHEMAS.items():
            warehouse.ensure_schema(table, schema)

    def reset(self) -> None:
        """Forget every piece of state (the transport reloads it from a checkpoint); the
        configuration, the partitions held and the listeners stay."""
        listeners = self.listeners
        self.__init__(self.config, self.warehouse, self._now,  # type: ignore[misc]
                      self.telemetry_clock, self.partitioning, self.spans)
        self.listeners = listeners

    # -- partitions ------------------------------------------------------------------

    @property
    def held(self) -> set[int]:
        """The partitions this engine holds."""
        return set(self.partitioning.owned) if self.partitioning is not None else {0}

    @property
    def owner(self) -> bool:
        """Writes the cluster-wide facts and the per-attempt totals."""
        return self.partitioning is None or self.partitioning.owner

    @property
    def cluster(self) -> bool:
        return self.config.cluster_facts and self.owner

    @property
    def exchanges(self) -> bool:
        """Attempt totals may need parts from other instances."""
        return self.partitioning is not None and self.partitioning.count > 1

    @property
    def closed_until(self) -> datetime | None:
        """Every minute before this is closed in every partition held."""
        held = [self.part_closed[p] for p in self.held if p in self.part_closed]
        return min(held) if held else None

    @closed_until.setter
    def closed_until(self, value: datetime | None) -> None:
        if value is None:
            self.part_closed = {}
        else:
            self.part_closed = {p: value for p in self.held}

    def begin_at(self, first_minute: datetime) -> None:
        """Close minutes from ``first_minute`` on, whatever the events before it: a window
        of a history, whose earlier events (a pod submitted before the window) update the
        books as late events do, and write no minute before it."""
        self.started = first_minute
        self.closed_until = first_minute

    def suffix(self, partition: int) -> str:
        """The file-name suffix of a partition's files ("" without partitioning)."""
        return "" if self.partitioning is None else self.partitioning.suffix(partition)

    def partition_expr(self, frame: pl.DataFrame, column: str = "node") -> pl.Expr:
        """Each row's partition from its node."""
        if self.partitioning is None:
            return pl.lit(0, pl.Int64)
        return self.partitioning.column(column, frame)

    def partitions_of(self, nodes: str | None) -> set[int]:
        if self.partitioning is None:
            return {0} if nodes else set()
        return self.partitioning.partitions_of(nodes)

    def start_partition(self, partition: int, closed: datetime | None) -> None:
        """Hold ``partition`` from now on, closed up to ``closed`` (its handed-over
        closed point; None: nothing of it closed yet, so from this engine's first input)."""
        assert self.partitioning is not None
        self.partitioning.owned.add(partition)
        start = closed or self.started
        if start is not None:
            self.part_closed[partition] = start

    def stop_partition(self, partition: int) -> None:
        """Let ``partition`` go (its state was handed over: see ``checkpoint.py``)."""
        assert self.partitioning is not None
        self.partitioning.owned.discard(partition)
        self.part_closed.pop(partition, None)

    # -- input ---------------------------------------------------------------------

    def process(self, batch: Batch, validated: bool = False,
                event_time_limit: datetime | None = None, behind: bool = False,
                close: bool = True) -> None:
        """Take one micro-batch; close every minute the watermark has passed.

        ``event_time_limit`` caps the watermark: a transport reading several partitions
        passes a bound of the event times still unread in them, so that a partition
        read ahead of the others cannot make the others' samples late. ``behind``: more
        input is already waiting (see :meth:`advance`). ``close`` off: the end of the
        input follows (:meth:`flush`), which closes this batch's minutes with the rest
        in one pass instead of two (a close pass has a fixed cost); the facts are the
        same either way.
        """
        self.counters.batches += 1
        frames: dict[RecordType, pl.DataFrame] = {}
        for record_type in ("telemetry", "inventory", "job"):
            frame = batch.get(record_type)
            if frame is None or frame.is_empty():
                continue
            if validated:
                good = conform(frame, record_type)
            else:
                good, bad = validate(frame, record_type, now=self._now(),
                                     max_future_s=self.config.windows.max_future_s,
                                     limits=self.config.limits)
                self.add_rejects(bad)
            self.counters.records_in[record_type] += frame.height
            if not good.is_empty():
                frames[record_type] = good
        self._ingest(frames, behind)
        if close:
            self.advance(event_time_limit, behind)

    def add_rejects(self, rejects: pl.DataFrame, partition: int = 0,
                    records: int | None = None) -> None:
        """Record rejects found before the processor (e.g. by the JSON decoder).
        ``records``: how many records the rows stand for, when they are of one type and
        a row stands for several (a GPU-minute's samples); default one a row."""
        if rejects.is_empty():
            return
        self.rejects.append(rejects.select(REJECT_SCHEMA.names()).with_columns(
            pl.lit(partition, pl.Int64).alias("partition")))
        for (record_type,), group in rejects.group_by(["record_type"]):
            kind = "unknown" if record_type is None else str(record_type)
            self.counters.add_rejects(kind, group.height if records is None else records)

    def _ingest(self, frames: dict[RecordType, pl.DataFrame], behind: bool = False) -> None:
        newest: pl.DataFrame | None = None
        if "telemetry" in frames:
            frames["telemetry"], newest = self._reject_ahead(frames["telemetry"], behind)
            if frames["telemetry"].is_empty():  # every sample of the batch was ahead
                del frames["telemetry"]
        clocks = {k: f for k, f in frames.items()
                  if (k == "telemetry" or not self.telemetry_clock) and not f.is_empty()}
        if self.started is None and clocks:
            self.started = self._first_minute(list(clocks.values()))
            for p in self.held:
                self.part_closed.setdefault(p, self.started)
        closed = self.closed_until
        if "inventory" in frames:
            inv = frames["inventory"]
            if closed is not None:
                before = inv.filter(pl.col("time") < closed).height
                if self._nothing_closed():
                    self.counters.early_inventory += before
                else:
                    self.counters.late_inventory += before
            self._bump_other(inv)
            self.inventory.apply(inv)
        if "job" in frames:
            jobs = frames["job"]
            refused = self._apply_jobs(jobs, closed)
            self.counters.duplicate_job_events = self.jobs.counters.duplicates
            self.counters.out_of_order_job_events = self.jobs.counters.out_of_order
            if not refused.is_empty():
                self._reject_job_events(refused)
            self._bump_other(jobs)
        if "telemetry" in frames:
            self._ingest_telemetry(frames["telemetry"], newest)

    def _apply_jobs(self, jobs: pl.DataFrame, closed: datetime | None) -> pl.DataFrame:
        """Apply job events to the book (the refused ones back). Events before ``closed``
        are late: counted, and since closed minutes are not rewritten, so is the
        allocated time those minutes got wrong each way (``facts/late_allocation.py``)."""
        late = jobs.filter(pl.col("time") < closed) if closed is not None else jobs.clear()
        if self._nothing_closed():
            self.counters.early_job_events += late.height
            return self.jobs.apply(jobs)
        self.counters.late_job_events += late.height
        if late.is_empty() or closed is None or self.started is None:
            return self.jobs.apply(jobs)
        span = (ms(self.started), ms(closed))
        before = late_allocation.charged_ms(self.jobs.allocations(), *span)
        refused = self.jobs.apply(jobs)
        over, under = late_allocation.late_error(
            before, late_allocation.charged_ms(self.jobs.allocations(), *span))
        c = self.counters
        c.late_overcharged_ms += over
        c.late_undercharged_ms += under
        first: datetime = late["time"].min()  # type: ignore[assignment]
        c.late_job_max_ms = max(c.late_job_max_ms, int((closed - first).total_seconds() * 1000))
        return refused

    def _nothing_closed(self) -> bool:
        """Whether no minute is closed yet though the first minute is set (a window of a
        history, :meth:`begin_at`): events before it then only update the books, and no
        closed minute is wrong for them; they are early, not late."""
        return (self.closed_until is not None and self.started is not None
                and self.closed_until <= self.started)

    def _first_minute(self, frames: list[pl.DataFrame]) -> datetime:
        """Where the processor starts: the first minute of its first events, leaving out
        those more than ``windows.max_behind_s`` behind the batch's median (one record from
        a wrong year would otherwise make it walk the years between; such records are
        late: kept and counted)."""
        times = pl.concat([f.select("time") for f in frames])["time"]
        floor = times.median() - timedelta(seconds=self.config.windows.max_behind_s)  # type: ignore[operator]
        first = times.filter(times >= floor).min()
        assert isinstance(first, datetime)
        return _floor_minute(first)

    def _fleet_time(self, node_time: dict[str, datetime] | None = None) -> datetime | None:
        """The fleet's progress: the 90th percentile (nearest rank) of the nodes' newest
        sample times — where most of the fleet has reached, whatever one node's clock
        says (fewer than one node in ten ahead cannot move it)."""
        times = self.node_time if node_time is None else node_time
        if not times:
            return None
        ordered = sorted(times.values())
        return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]

    def _partition_fleets(self, node_time: dict[str, datetime]) -> dict[int, datetime]:
        """Per partition, the median (lower) of its nodes' newest sample times."""
        by_part: dict[int, list[datetime]] = {}
        for node, when in node_time.items():
            p = 0 if self.partitioning is None else self.partitioning.of(node)
            by_part.setdefault(p, []).append(when)
        return {p: sorted(times)[(len(times) - 1) // 2] for p, times in by_part.items()}

    def _reject_ahead(self, tel: pl.DataFrame, behind: bool = False
                      ) -> tuple[pl.DataFrame, pl.DataFrame | None]:
        """Telemetry more than ``windows.max_ahead_s`` ahead of the fleet is rejected with
        its reason (a node's clock running ahead must not fabricate minutes no other node
        has reached). The fleet's progress counts this batch's samples too, node by node.

        While the transport is behind its input (a replay, a catch-up), partitions are
        read at different paces, a day apart or more: a sample is then rejected when it
        is more than ``windows.max_behind_s`` (and ``max_ahead_s``) ahead of the median
        node of its own partition, whose nodes are read together (a node 2 days ahead
        filled every GPU of the fleet with idle minutes up to its clock). Returns the
        samples kept and, when that is all of them, each node's newest sample time."""
        newest = dict(self.node_time)
        by_node = _newest_by_node(tel)
        for node, when in by_node.iter_rows():
            if node not in newest or when > newest[node]:
                newest[node] = when
        w = self.config.windows
        if behind:
            margin = max(w.max_ahead_s, w.max_behind_s)
            fleets = self._partition_fleets(newest)
            if not fleets:
                return tel, by_node
            limits = {p: f + timedelta(seconds=margin) for p, f in fleets.items()}

            def ahead_of(frame: pl.DataFrame) -> pl.Expr:
                limit = self.partition_expr(frame).replace_strict(
                    limits, default=None, return_dtype=frame.schema["time"])
                return (pl.col("time") > limit).fill_null(False)
            what = f"{margin} s ahead of its partition's median node"
            fleet = None
        else:
            margin = w.max_ahead_s
            fleet = self._fleet_time(newest)
            if fleet is None:
                return tel, by_node
            limit = pl.lit(fleet + timedelta(seconds=margin)).cast(TIME_DTYPE)

            def ahead_of(frame: pl.DataFrame) -> pl.Expr:
                return pl.col("time") > limit
            what = (f"{margin} s ahead of the fleet (its 90th percentile node at "
                    f"{fleet:%Y-%m-%dT%H:%M:%SZ})")
        # a node whose newest sample is not ahead has none ahead: the samples are looked
        # at only when some node's is (the nodes' partitions found once per node, not
        # per sample: while catching up this was a tenth of the processor's CPU)
        if by_node.filter(ahead_of(by_node)).is_empty():
            return tel, by_node
        ahead = ahead_of(tel)
        bad = tel.filter(ahead)  # not empty: the sample of a node's newest time is ahead
        self.counters.ahead_telemetry += bad.height
        fmt = "%Y-%m-%dT%H:%M:%S%.3fZ"
        reason = (pl.lit("field 'time': ") + pl.col("time").dt.strftime(fmt)
                  + pl.lit(f" is more than {what}: a clock running ahead?"))
        rows = bad.select(
            pl.lit("telemetry").alias("record_type"), pl.lit("processor").alias("source"),
            pl.lit(None, pl.Int64).alias("line"), reason.alias("reason"),
            pl.struct("node", "gpu_index", pl.col("time").dt.strftime(fmt))
            .struct.json_encode().alias("raw"),
            self.partition_expr(bad).alias("partition"))
        for (part,), group in rows.group_by("partition"):
            assert isinstance(part, int)
            self.add_rejects(group.drop("partition"), part)
        log.warning("%d telemetry sample(s) more than %s rejected (first: node %s at %s)",
                    bad.height, what, bad["node"][0], bad["time"][0])
        return tel.filter(~ahead), None

    def _reject_job_events(self, refused: pl.DataFrame) -> None:
        rows = refused.select(
            pl.lit("job").alias("record_type"), pl.lit("job book").alias("source"),
            pl.lit(None, pl.Int64).alias("line"), pl.col("reason"),
            pl.struct("job_id", "event", pl.col("time").dt.strftime("%Y-%m-%dT%H:%M:%S%.3fZ"))
            .struct.json_encode().alias("raw"))
        if self.owner:
            self.add_rejects(rows)
        log.warning("%d job event(s) rejected as out of order (first: %s)", refused.height,
                    refused["reason"][0])

    def _ingest_telemetry(self, tel: pl.DataFrame, by_node: pl.DataFrame | None = None
                          ) -> None:
        """Fold samples into the open minutes. ``by_node``: each node's newest sample time
        in ``tel``, when the caller has it already."""
        tel = tel.with_columns(self.partition_expr(tel).alias("partition"))
        if self.partitioning is not None:
            held = list(self.held)
            mine = tel.filter(pl.col("partition").is_in(held))
            if mine.height < tel.height:
                self.counters.misrouted_telemetry += tel.height - mine.height
                log.warning("%d telemetry sample(s) for nodes of partitions not held here "
                            "dropped (producers must use Kafka's default murmur2 "
                            "partitioner, keyed by node)", tel.height - mine.height)
            if mine.is_empty():
                return
            if mine.height < tel.height:
                by_node = None
            tel = mine
        # one chunk: the filters and group-bys below read chunked columns slower (the card
        # check: 2x). The Kafka decoder hands over one chunk already (free here); the
        # embedded bus and the importers may not
        tel = prepare(tel.drop("partition")).with_columns(tel["partition"]).rechunk()
        newest = tel.select(pl.col("time").max()).item()
        if self.max_telemetry_time is None or newest > self.max_telemetry_time:
            self.max_telemetry_time = newest
        for node, when in (by_node if by_node is not None else _newest_by_node(tel)
                           ).iter_rows():
            old = self.node_time.get(node)
            if old is None or when > old:
                self.node_time[node] = when
        closed = {ms(c) for c in self.part_closed.values()}
        cutoff = pl.lit(min(closed, default=0), pl.Int64) if len(closed) <= 1 else pl.col(
            "partition").replace_strict({p: ms(c) for p, c in self.part_closed.items()},
                                        default=0, return_dtype=pl.Int64)
        is_late = pl.col("minute_ms") < cutoff
        late = tel.filter(is_late)
        if not late.is_empty():
            self.counters.late_telemetry += late.height
            for (hour, part), rows in late.group_by(
                    pl.col("minute").dt.truncate("1h").alias("h"), "partition"):
                assert isinstance(hour, datetime) and isinstance(part, int)
                self.late_parts.setdefault((hour, part), []).append(
                    rows.drop("activity", "n_proc", "n_unattributed", "partition",
                              "minute_ms"))
            tel = tel.filter(~is_late)
        if tel.is_empty():
            return
        tel = self._reject_beyond_card_memory(tel)
        fresh, repeats = self.sample_keys.take_new(tel)
        self.counters.duplicate_samples += repeats
        if fresh.is_empty():
            return
        self.tel_parts.append(telemetry.partials(fresh))
        memory = telemetry.job_memory(fresh)
        if not memory.is_empty():
            self.mem_parts.append(memory)

    def _reject_beyond_card_memory(self, tel: pl.DataFrame) -> pl.DataFrame:
        """Samples using more memory than their node's card has (per its inventory), with
        ``limits.memory_margin``, are rejected with the reason: a 10 TB peak is a bad
        reading, not a job's memory. (Samples of a node whose inventory is not known yet
        pass; the record's own ``mem_total_mib`` bounds them, ``validate.py``.)"""
        margin = 1.0 + self.config.limits.memory_margin
        cards = self.inventory.node_memory().filter(pl.col("gpu_mem_mib").is_not_null())
        if cards.is_empty():
            return tel
        floor = cards["gpu_mem_mib"].min() * margin  # type: ignore[operator]
        top = tel.select(pl.col("mem_used_mib").max()).item()
        if top is None or top <= floor:
            return tel
        # a mixed fleet: first each node's highest reading against its own card (one
        # small group-by), and only the nodes over it looked at sample by sample
        tops = engines.kept_frame(
            tel.lazy().group_by("node").agg(pl.col("mem_used_mib").max().alias("top")))
        over_nodes = tops.join(cards, on="node", how="inner").filter(
            pl.col("top") > pl.col("gpu_mem_mib") * margin)
        if over_nodes.is_empty():
            return tel
        cards = over_nodes.select("node", "gpu_mem_mib")
        card = pl.col("node").replace_strict(cards["node"], cards["gpu_mem_mib"],
                                             default=None, return_dtype=pl.Float64)
        over = (pl.col("mem_used_mib") > card * margin).fill_null(False)
        mask = tel.select(over).to_series()
        if not mask.any():
            return tel
        bad = tel.filter(mask).with_columns(card.alias("gpu_mem_mib"))
        fmt = "%Y-%m-%dT%H:%M:%S%.3fZ"
        reason = (pl.lit("field 'mem_used_mib': ") + pl.col("mem_used_mib").cast(pl.String)
                  + pl.lit(" MiB is more than the card's ") + pl.col("gpu_mem_mib").cast(pl.String)
                  + pl.lit(f" MiB (node inventory) + {round((margin - 1) * 100)} %"))
        rows = bad.select(
            pl.lit("telemetry").alias("record_type"), pl.lit("processor").alias("source"),
            pl.lit(None, pl.Int64).alias("line"), reason.alias("reason"),
            pl.struct("node", "gpu_index", pl.col("time").dt.strftime(fmt), "mem_used_mib")
            .struct.json_encode().alias("raw"), "partition")
        for (part,), group in rows.group_by("partition"):
            assert isinstance(part, int)
            self.add_rejects(group.drop("partition"), part)
        self.counters.implausible_telemetry += bad.height
        return tel.filter(~mask)

    def _bump_other(self, frame: pl.DataFrame) -> None:
        newest = frame.select(pl.col("time").max()).item()
        if self.max_other_time is None or newest > self.max_other_time:
            self.max_other_time = newest

    def _watermark(self, catching_up: bool = False) -> datetime | None:
        """The slowest node still reporting, minus the lateness. A node counts while its
        newest sample is within ``node_stall_s`` (catching up: a close step) of the
        fleet's progress (:meth:`_fleet_time`): a node that stopped reporting stops holding
        the windows, and one node far ahead moves nothing."""
        w = self.config.windows
        lateness = timedelta(seconds=w.allowed_lateness_s)
        fleet = self._fleet_time()
        newest: datetime | None = None
        if fleet is not None:
            stall = timedelta(seconds=w.node_stall_s)
            if catching_up:
                stall = max(stall, timedelta(minutes=w.catchup_close_minutes))
            horizon = fleet - stall
            self.node_time = {n: t for n, t in self.node_time.items() if t >= horizon}
            newest = min(self.node_time.values(), default=fleet)
        if newest is None and not self.telemetry_clock:
            newest = self.max_other_time
        return None if newest is None else min(newest, self._now()) - lateness

    def catching_up(self, behind: bool) -> bool:
        """More input is waiting (``behind``) and what was read is past input: its
        newest sample is more than ``windows.catchup_close_minutes`` older than the
        wall clock (a restart after an outage, a replay). Live input never is."""
        newest = self.max_telemetry_time
        step = timedelta(minutes=self.config.windows.catchup_close_minutes)
        return behind and newest is not None and newest < self._now() - step

    def advance(self, limit: datetime | None = None, behind: bool = False) -> None:
        """Close the minutes the watermark (capped by ``limit``) has passed.

        ``behind``: the transport has more input waiting. When it is also past input
        (:meth:`catching_up`), closing goes in steps, since a close pass has a fixed
        cost: minutes close up to the last multiple of ``windows.catchup_close_minutes``
        (of the day) they passed, or all of them once
        ``windows.catchup_close_interval_s`` has passed since the last pass; and a node
        read up to a step behind the others (not only ``windows.node_stall_s``) still
        holds the watermark, since replayed messages may each span minutes. Otherwise
        minutes close as soon as the watermark passes them. When minutes close changes
        how fresh the facts are, not what they hold. A transport that passes ``behind``
        calls this again when it has nothing to read (``close_pending``).
        """
        w = self.config.windows
        catching_up = self.catching_up(behind)
        mark = self._watermark(catching_up)
        closed = self.closed_until
        if mark is None or closed is None:
            return
        if limit is not None:
            mark = min(mark, limit - timedelta(seconds=w.allowed_lateness_s))
        end = _floor_minute(mark)
        if end <= closed:
            return
        if catching_up and time.monotonic() - self._last_close < w.catchup_close_interval_s:
            step = _floor_step(end, w.catchup_close_minutes)
            if step <= closed:
                self.close_pending = True
                return
            end = step
        self.close_until(end)
        self.close_pending = False
        self._last_close = time.monotonic()

    def write_partial(self) -> None:
        """Make what is buffered durable without closing open minutes (graceful stop).

        Partial hours are written (and rewritten whole when they complete), late samples
        and snapshots too; the open windows stay open.
        """
        if self.closed_until is None:
            return
        self._write_hours(final=True)
        self._write_late()
        self._write_snapshots()
        self.warehouse.publish_catalog()

    def newest_time(self) -> datetime | None:
        """The time of the newest event taken (telemetry, job or inventory)."""
        return max((t for t in (self.max_telemetry_time, self.max_other_time) if t),
                   default=None)

    def flush(self, until: datetime | None = None) -> None:
        """End of input: close every minute up to ``until`` (default: the newest event,
        rounded up to a whole minute), write everything."""
        end = until
        if end is None:
            newest = self.newest_time()
            if newest is not None:
                end = _floor_minute(newest)
                if end < newest:
                    end += timedelta(minutes=1)
        if end is not None and self.closed_until is not None:
            self.close_until(end)
        closed = self.closed_until
        self._step_written = set()
        self._write_hours(final=True)
        # a last hour closed in part is written from this run's rows alone: like a whole
        # hour, it keeps nothing an earlier run wrote of a table this run has none of
        if self.partitioning is None and closed is not None and closed != _floor_hour(closed):
            self._drop_unwritten([_floor_hour(closed)])
        self._step_written = set()
        if self.partitioning is None:
            self._drop_earlier_rows()
        self._write_late()
        self._write_snapshots()
        if self.exchanges and not self.owner:
            # tell the owner this engine's partitions' last parts are sent (batch runs
            # wait for it)
            for p in sorted(self.held):
                self.outbox.append(pl.DataFrame(
                    {"shard": [p], "kind": ["flushed"]}).with_columns(
                    *[pl.lit(None, dtype).alias(name) for name, dtype in ACC_SCHEMA.items()]
                ).select(PARTS_SCHEMA.names()))
        self._write_rejects()
        self.warehouse.publish_catalog()
        self.warehouse.end_compaction()
        uncharged = self.counters.uncharged_allocation_ms
        if uncharged > self._uncharged_said:
            self._uncharged_said = uncharged
            log.warning("%s allocated GPU-second(s) were on GPUs no inventory knew at the "
                        "time (an unknown node or GPU index, a GPU gone from the inventory): "
                        "not charged (docs/metrics.md, 'Rejected')", f"{uncharged / 1000:,.1f}")
        self._say_rejected_telemetry()
        c = self.counters
        wrong = (c.late_overcharged_ms, c.late_undercharged_ms)
        if wrong != self._late_said and any(wrong):
            self._late_said = wrong
            log.warning("%.2f GPU-hour(s) were charged to attempts after they ended and %.2f "
                        "not charged before they started: their job events arrived after "
                        "their minutes had closed (up to %s late), and closed facts are not "
                        "rewritten (docs/metrics.md, 'Late job events'). If the scheduler "
                        "feed lags this much, raise windows.allowed_lateness_s",
                        wrong[0] / 3_600_000, wrong[1] / 3_600_000,
                        timedelta(seconds=c.late_job_max_ms // 1000))
        over = self.counters.overcommitted_gpu_minutes
        if over and not self._overcommit_said:
            self._overcommit_said = True
            log.warning("%d GPU-minute(s) had allocations summing to more than the whole GPU "
                        "(jobs given the same GPU at once): each counts as allocated once "
                        "(docs/metrics.md, 'Overcommitted GPUs'; SELECT * FROM gpu_minute "
                        "WHERE alloc_fraction > 1)", over)

    # -- closing minutes -------------------------------------------------------------

    def now_minute(self) -> datetime:
        """The start of the processor's own clock's current minute."""
        return _floor_minute(self._now())

    def _not_past_now(self, end: datetime) -> datetime:
        """``end``, or the end of :meth:`now_minute` when ``end`` is after it: no minute
        that begins after the processor's own clock is closed, whatever a clock ahead
        stamped on its records (a node 50 min ahead had its GPUs' minutes closed, and a
        running job charged, up to 50 min past the wall clock). The current minute
        closes at the end of an input, as it did (live input that ends now). The records
        after it stay open, in the saved state."""
        limit = self.now_minute() + timedelta(minutes=1)
        if end <= limit:
            return end
        if not self._ahead_said:
            self._ahead_said = True
            log.warning("the input runs to %s, %s after this machine's clock (%s): the "
                        "minutes from %s on are not closed, as they have not begun (a "
                        "clock ahead, or local times read as UTC?); they stay open for the "
                        "next run to close",
                        f"{end:%Y-%m-%d %H:%M} UTC", end - limit,
                        f"{self._now():%H:%M:%S} UTC", f"{limit:%H:%M}")
        return limit

    def close_until(self, end: datetime) -> None:
        """Close all minutes before ``end`` in every partition held, in steps: while
        telemetry is buffered, at most an hour from where the last step ended, or the rest
        if less than ``DENSE_TAIL`` would be left (a step has a fixed cost: an hourly batch
        whose watermark is past a whole hour closes in one step, not two); without
        telemetry, up to a day from the hour it starts in. Never past the end of
        :meth:`now_minute`."""
        end = self._not_past_now(end)
        closed = self.closed_until
        assert closed is not None
        while closed < end:
            if self.tel_parts:
                step_end = min(end, closed + DENSE_STEP)
                if end - step_end < DENSE_TAIL:
                    step_end = end
            else:
                step_end = min(end, _floor_hour(closed) + SPARSE_STEP)
            self._close(closed, step_end)
            for p in self.held:
                if self.part_closed.get(p, step_end) < step_end:
                    self.part_closed[p] = step_end
            step = (closed, step_end)
            closed = self.closed_until
            assert closed is not None
            for listener in self.listeners:
                listener.closed(self, step_end)
            self._step = step if self.partitioning is None else None
            if self._step is not None and self._run_from is None:
                self._run_from = step[0]
                self._earlier = self.warehouse.part_days(list(MERGED_TABLES))
                self._earlier_hourly = self.warehouse.part_days(["gpu_hourly"]).get(
                    "gpu_hourly", set())
            try:
                self._write_hours(final=False)
            finally:
                self._step, self._step_written = None, set()
            if self.late_parts:  # durable now, not held in memory until the stop
                self._write_late()
            if self._snapshot_due():   # running attempts as of this step, in its generation
                self._write_snapshots()
            self.warehouse.commit(closed)  # the step's files become one generation
            self.sample_keys.forget_before(ms(closed))
            horizon = closed - timedelta(seconds=self.config.windows.handover_retention_s)
            if self.started is not None and horizon > self.started:
                self.pruned_to = horizon
            self.jobs.prune(horizon)
            self._forget_completed(closed)
            self.inventory.prune(ms(horizon))

    @staticmethod
    def _take(parts: list[pl.DataFrame], b_ms: int) -> tuple[list[pl.DataFrame],
                                                               list[pl.DataFrame]]:
        """Split chunks into the rows of minutes before ``b_ms`` and the rest (a chunk
        wholly on one side is not copied)."""
        taken: list[pl.DataFrame] = []
        kept: list[pl.DataFrame] = []
        before = pl.col("minute_ms") < b_ms
        for chunk in parts:
            lo, hi = chunk.select(pl.col("minute_ms").min().alias("lo"),
                                  pl.col("minute_ms").max().alias("hi")).row(0)
            if hi < b_ms:
                taken.append(chunk)
            elif lo >= b_ms:
                kept.append(chunk)
            else:
                taken.append(chunk.filter(before))
                kept.append(chunk.filter(~before))
        return [t for t in taken if not t.is_empty()], kept

    def _take_telemetry(self, b_ms: int) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
        """The telemetry and job memory of the open minutes before ``b_ms`` (removed)."""
        taken, self.tel_parts = self._take(self.tel_parts, b_ms)
        mem, self.mem_parts = self._take(self.mem_parts, b_ms)
        telem = telemetry.finish(telemetry.merge(taken)) if taken else None
        return telem, telemetry.merge_memory(mem) if mem else None

    def _close(self, a: datetime, b: datetime) -> None:
        """Close ``[a, b)``: each partition from its own closed point (if before ``b``)."""
        a_ms, b_ms = ms(a), ms(b)
        bounds = {p: ms(c) for p, c in self.part_closed.items() if p in self.held and c < b}
        self.counters.minutes_closed += (b_ms - a_ms) // MINUTE_MS
        self.counters.close_passes += 1
        telem, memory = self._take_telemetry(b_ms)
        attrs = self.jobs.attributes()
        node_runs = self.inventory.runs(a_ms, b_ms)
        allocations = self.jobs.allocations()
        if bounds:
            self._close_gpus(telem, memory, node_runs, allocations, attrs, bounds, b_ms)
        cluster_from = self.part_closed.get(0) if self.cluster else None
        if cluster_from is not None and cluster_from < b:
            self._close_cluster(node_runs, allocations, attrs, cluster_from, b)
        self._finish_attempts(bounds, b)

    def _with_partition(self, frame: pl.DataFrame) -> pl.DataFrame:
        return frame.with_columns(self.partition_expr(frame).alias("partition"))

    def _close_gpus(self, agg: pl.DataFrame | None, memory: pl.DataFrame | None,
                    node_runs: pl.DataFrame,
                    allocations: pl.DataFrame, attrs: pl.DataFrame,
                    bounds: dict[int, int], b_ms: int) -> None:
        """The per-GPU facts of the partitions in ``bounds`` (partition → closed point).

        GPUs with telemetry in the step get a row per minute; the others get spans of
        identical minutes, and a row per minute only where an allocation starts or ends
        inside a minute (``facts/spans.py``)."""
        lo = pl.col("partition").replace_strict(bounds, default=None, return_dtype=pl.Int64)
        own_nodes = self._with_partition(node_runs).filter(
            pl.col("partition").is_in(list(bounds))).with_columns(
            pl.max_horizontal(pl.col("from_ms"), lo).alias("from_ms")).filter(
            pl.col("from_ms") < pl.col("to_ms"))
        runs = engines.step_frame(gpu_runs(own_nodes))
        pieces = engines.step_frame(clip_ms(self._with_partition(allocations).filter(
            pl.col("partition").is_in(list(bounds))), "start", "end", lo, b_ms))
        self._count_uncharged(pieces, runs)
        telem = None
        exact_runs, exact_pieces = runs.clear(), pieces.clear()
        sparse_runs, sparse_pieces = runs, pieces
        if agg is not None:
            self._count_sequence(agg)
            telem = agg.lazy().drop("partition")
            seen = agg.select(GPU_KEYS).unique()
            exact_runs = runs.join(seen, on=GPU_KEYS, how="semi")
            exact_pieces = pieces.join(seen, on=GPU_KEYS, how="semi")
            sparse_runs = runs.join(seen, on=GPU_KEYS, how="anti")
            sparse_pieces = pieces.join(seen, on=GPU_KEYS, how="anti")
        if not self.spans:
            exact_runs, exact_pieces = runs, pieces
            sparse_runs, sparse_pieces = runs.clear(), pieces.clear()
        span_gpu = span_jobs = None
        if not sparse_runs.is_empty():
            edges, spans = split_runs(sparse_runs.lazy(), sparse_pieces.lazy())
            edges_df = engines.step_frame(edges)
            edge_pieces = sparse_pieces.join(
                edges_df.select(*GPU_KEYS, pl.col("from_ms").alias("_u"),
                                pl.col("to_ms").alias("_v")), on=GPU_KEYS, how="inner"
            ).filter((pl.col("s_ms") < pl.col("_v")) & (pl.col("e_ms") > pl.col("_u"))
                     ).with_columns(pl.max_horizontal("s_ms", "_u").alias("s_ms"),
                                    pl.min_horizontal("e_ms", "_v").alias("e_ms")
                                    ).drop("_u", "_v")
            exact_runs = pl.concat([exact_runs, edges_df.select(exact_runs.columns)])
            exact_pieces = pl.concat([exact_pieces, edge_pieces.select(exact_pieces.columns)])
            span_gpu, span_jobs = span_rows(spans, sparse_pieces.lazy())
        # collected once: the GPU rows and the job rows both read it
        job_minutes = engines.step_frame(job_minute_rows(exact_pieces.lazy())).lazy()
        alloc = allocation_per_gpu_minute(job_minutes, merged_occupancy(exact_pieces.lazy()))
        t = self.config.thresholds
        parts = [dense_gpu_rows(exact_runs.lazy(), alloc, telem, t).with_columns(
            pl.lit(False).alias("span"))]
        job_parts = [job_minutes]
        if span_gpu is not None and span_jobs is not None:
            parts.append(finish_gpu_rows(span_gpu, t).with_columns(pl.lit(True).alias("span")))
            job_parts.append(span_jobs)
        main = attrs.lazy().select("job_id", "team", "queue", "job_type", "user", "priority")
        gpu = engines.step_frame(
            pl.concat(parts, how="diagonal_relaxed").join(main, on="job_id", how="left"))
        if agg is not None:
            self._reject_unplaced_telemetry(gpu, agg)
        over = gpu.select(pl.col("n_minutes").filter(
            pl.col("alloc_fraction") > OVERCOMMITTED).sum()).item()
        self.counters.overcommitted_gpu_minutes += int(over or 0)
        job_attrs = attrs.lazy().select("job_id", "team", "queue", "job_type")
        jobs = self._with_job_memory(engines.step_frame(job_rows_with_context(
            pl.concat(job_parts, how="diagonal_relaxed"), gpu.lazy()).join(
            job_attrs, on="job_id", how="left")), memory)
        self._emit_gpu_minutes(gpu)
        self._emit_job_minutes(jobs)
        partial = engines.kept_frame(
            rollup.hourly_partial(rollup.share_rows(gpu.lazy(), jobs.lazy())))
        for (hour_ms, part), rows in partial.group_by("hour_ms", "partition"):
            assert isinstance(hour_ms, int) and isinstance(part, int)
            self.rollup_parts.setdefault((_hour_of(hour_ms), part), []).append(rows)
        inc = job_usage.minute_usage(jobs.lazy(), self.config)
        self.acc = job_usage.merge(self.acc, inc)

    def _count_uncharged(self, pieces: pl.DataFrame, runs: pl.DataFrame) -> None:
        """Count the allocated GPU-time that falls outside every inventory run of its GPU
        (an unknown node or GPU index, a GPU gone from the inventory): it is not charged,
        and :meth:`flush` says how much."""
        if pieces.is_empty():
            return
        held = pieces.select((pl.col("e_ms") - pl.col("s_ms")).sum()).item() or 0
        covered = pieces.join(runs.select(*GPU_KEYS, "from_ms", "to_ms"), on=GPU_KEYS,
                              how="inner").select(
            (pl.min_horizontal("e_ms", "to_ms") - pl.max_horizontal("s_ms", "from_ms"))
            .clip(lower_bound=0).sum()).item() or 0
        if held > covered:
            self.counters.uncharged_allocation_ms += int(held - covered)

    @staticmethod
    def _with_job_memory(jobs: pl.DataFrame, memory: pl.DataFrame | None) -> pl.DataFrame:
        """``job_mem_mib``: each job's own processes' memory on the GPUs it shares."""
        if memory is None or jobs.filter(pl.col("fraction") < 1.0).is_empty():
            return jobs.with_columns(pl.lit(None, pl.Float64).alias("job_mem_mib"))
        return jobs.join(memory.drop("partition"), on=[*MINUTE_KEYS, "job_id"], how="left")

    def _reject_unplaced_telemetry(self, gpu: pl.DataFrame, agg: pl.DataFrame) -> None:
        """Samples of GPUs no inventory knows (an unknown node, GPU 99 of 8) are rejected,
        a reject row per GPU-minute: nothing unknown adds to capacity."""
        placed = gpu.filter(pl.col("telemetry_samples") > 0).height
        if agg.height == placed:
            return
        missing = agg.join(gpu.select(MINUTE_KEYS), on=MINUTE_KEYS, how="anti")
        known = self.inventory.records.group_by("node").agg(pl.col("gpu_count").last())
        rows = missing.join(known, on="node", how="left")
        minute = to_time(pl.col("minute_ms")).dt.strftime("%Y-%m-%dT%H:%MZ")
        reason = (pl.when(pl.col("gpu_count").is_null())
                  .then(pl.lit("no inventory for node '") + pl.col("node") + pl.lit("'"))
                  .when(pl.col("gpu_index") < pl.col("gpu_count"))  # a GPU it has now
                  .then(pl.lit("no inventory for node '") + pl.col("node")
                        + pl.lit("' at that time (its records are of other times)"))
                  .otherwise(pl.lit("GPU ") + pl.col("gpu_index").cast(pl.String)
                             + pl.lit(" of node '") + pl.col("node") + pl.lit("', which has ")
                             + pl.col("gpu_count").cast(pl.String) + pl.lit(" GPUs"))
                  + pl.lit(": ") + pl.col("telemetry_samples").cast(pl.String)
                  + pl.lit(" sample(s) in minute ") + minute)
        self.counters.unplaced_telemetry += int(rows["telemetry_samples"].sum())
        for (part,), group in rows.group_by("partition"):
            assert isinstance(part, int)
            self.add_rejects(group.select(
                pl.lit("telemetry").alias("record_type"), pl.lit("processor").alias("source"),
                pl.lit(None, pl.Int64).alias("line"), reason.alias("reason"),
                pl.struct("node", "gpu_index", to_time(pl.col("minute_ms")).dt.strftime(
                    "%Y-%m-%dT%H:%MZ").alias("minute"), pl.col("telemetry_samples")
                          .alias("samples")).struct.json_encode().alias("raw")), part,
                records=int(group["telemetry_samples"].sum()))

    def _emit_gpu_minutes(self, gpu: pl.DataFrame) -> None:
        """``gpu_minute`` rows, and ``gpu_span`` rows for spans of identical minutes."""
        t = self.config.thresholds
        out = gpu.with_columns(
            to_time(pl.col("minute_ms")).alias("minute"),
            pl.col("n_minutes").alias("minutes"),
            pl.lit(t.idle_activity).alias("idle_threshold"),
            pl.lit(t.efficient_activity).alias("efficient_threshold"),
        ).with_columns(pl.col("minute").dt.date().alias("date"))
        self._buffer_split("gpu_minute", out.filter(~pl.col("span")), "minute")
        self._buffer_split("gpu_span", out.filter(pl.col("span")), "minute")

    def _emit_job_minutes(self, jobs: pl.DataFrame) -> None:
        """Per job attempt, GPU and minute, for listeners (spans expanded to minutes)."""
        if not self.listeners or jobs.is_empty():
            return
        frame = jobs.with_columns(
            pl.int_ranges(pl.col("minute_ms"),
                          pl.col("minute_ms") + pl.col("n_minutes") * MINUTE_MS, MINUTE_MS)
            .alias("minute_ms")).explode("minute_ms").with_columns(
            to_time(pl.col("minute_ms")).alias("minute"), pl.lit(1, pl.Int64).alias("n_minutes"))
        for listener in self.listeners:
            listener.facts("job_gpu_minute", frame)

    def _close_cluster(self, node_runs: pl.DataFrame, allocations: pl.DataFrame,
                       attrs: pl.DataFrame, a: datetime, b: datetime) -> None:
        runs = node_runs.with_columns(
            pl.max_horizontal(pl.col("from_ms"), pl.lit(ms(a))).alias("from_ms")).filter(
            pl.col("from_ms") < pl.col("to_ms"))
        facts = cluster_facts(runs, allocations, self.jobs.pending(), attrs,
                              self.jobs.starts_between(starts_window(a), b), a, b)
        if facts.free_blocks is not None:
            self.last_free_blocks = facts.free_blocks
        self._buffer("frag_minute", facts.frag_minute, "minute", 0)
        self._buffer("pending_minute", facts.pending_minute, "minute", 0)
        self._buffer("blocked_minute", facts.blocked_minute, "minute", 0)

    # -- attempts ----------------------------------------------------------------------

    def _finish_attempts(self, bounds: dict[int, int], b: datetime) -> None:
        """Each partition closed just now reports its part of the attempts that ended in
        what it closed (or arrived late since); the owner writes an attempt once every
        partition that held one of its GPUs has reported."""
        cluster_from = self.part_closed.get(0) if self.owner else None
        if self.owner and cluster_from is not None and cluster_from < b:
            pre = self.jobs.take_preemptions(b)
            if not pre.is_empty() and self.cluster:
                self._buffer("preemptions", pre.with_columns(
                    pl.col("time").dt.date().alias("date")), "time", 0)
            ended_all = self.jobs.take_ended(b, OWNER)
            if not ended_all.is_empty():
                self.waiting = pl.concat([self.waiting, ended_all])
        ended = {p: e for p in sorted(bounds) if not (e := self.jobs.take_ended(b, p)).is_empty()}
        if ended:
            self._report_parts(ended)
        if self.owner:
            self._complete_attempts()

    def _report_parts(self, ended: dict[int, pl.DataFrame]) -> None:
        """Each partition's part of its ``ended`` attempts, all partitions in one pass:
        ``job_gpu`` rows, and its accumulators to the owner (taken here, or sent through
        the outbox, a frame per partition)."""
        keys = ["job_id", "attempt"]
        both = pl.concat([e.with_columns(pl.lit(p, pl.Int64).alias("partition"))
                          for p, e in ended.items()])
        held = [p in self.partitions_of(nodes) for p, nodes in both.select(
            "partition", "nodes").iter_rows()]
        mine = both.filter(pl.Series(held, dtype=pl.Boolean))
        if mine.is_empty():
            return
        acc = self.acc.join(mine.select(*keys, "partition"), on=[*keys, "partition"],
                            how="semi")
        if not acc.is_empty():
            self.acc = self.acc.join(acc.select(*keys, "node", "gpu_index"),
                                     on=[*keys, "node", "gpu_index"], how="anti")
        unheld = self._unheld_gpus(mine, acc)
        if not unheld.is_empty():
            acc = pl.concat([acc, unheld])
        if not acc.is_empty():
            gpus = job_usage.per_gpu(acc).join(mine.select(*keys, "partition", "ended_at"),
                                               on=[*keys, "partition"])
            self._buffer("job_gpu", gpus.with_columns(
                pl.col("ended_at").dt.date().alias("date")), "ended_at", None)
        parts = self._parts(mine, acc, "ended")
        if self.owner:
            self._take_parts(parts)
        else:
            by_shard = parts.partition_by("shard", as_dict=True, maintain_order=True)
            self.outbox.extend(rows for _, rows in sorted(by_shard.items()))

    def _unheld_gpus(self, attempts: pl.DataFrame, acc: pl.DataFrame) -> pl.DataFrame:
        """Accumulator rows of zeros for the GPUs of ``attempts`` (one row per attempt and
        partition) that have none: an attempt that ended the instant it started held
        them for no time, yet every attempt × GPU has a ``job_gpu`` row
        (docs/metrics.md). Card and memory are the node's record at the start; a GPU no
        inventory knows gets none (it is not charged, as any other allocation there)."""
        keys = ["job_id", "attempt"]
        allocs = self.jobs.allocations().join(attempts.select(*keys, "partition"), on=keys)
        if allocs.is_empty():
            return pl.DataFrame(schema=ACC_SCHEMA)
        # the column first: Polars 2.1 gives ``lit == col`` the wrong length where the
        # column came from a join as one value (a frame of ~20,000 rows or more, several
        # threads), and the filter failed: a day of 2,500 8-GPU jobs imported from sacct
        allocs = allocs.filter(pl.col("partition") == self.partition_expr(allocs))
        missing = allocs.join(acc.select(*keys, "node", "gpu_index"),
                              on=[*keys, "node", "gpu_index"], how="anti")
        if missing.is_empty():
            return pl.DataFrame(schema=ACC_SCHEMA)
        start = pl.col("start").cast(pl.Int64)
        runs = self.inventory.all_runs().select("node", "from_ms", "to_ms", "card_type",
                                                "gpu_mem_mib", "gpu_count")
        known = missing.join(runs, on="node").filter(
            (pl.col("from_ms") <= start)
            & (pl.col("to_ms").is_null() | (pl.col("to_ms") > start))
            & (pl.col("gpu_index") < pl.col("gpu_count")))
        return known.unique([*keys, "node", "gpu_index"], keep="first",
                            maintain_order=True).select(
            *keys, "node", "gpu_index", "partition", "card_type",
            pl.col("gpu_mem_mib").alias("gpu_mem_total_mib"), "fraction",
            *[pl.lit(0, pl.Int64).alias(c) for c in job_usage.SUMMED],
            pl.lit(None, pl.Float64).alias("mem_peak_mib"),
        ).select(ACC_SCHEMA.names()).cast(dict(ACC_SCHEMA))  # type: ignore[arg-type]

    def _parts(self, attempts: pl.DataFrame, acc: pl.DataFrame, kind: str,
               partition: int | None = None) -> pl.DataFrame:
        """A partition's part of ``attempts``: its accumulator rows, plus one marker row
        (node null) per attempt, so that an attempt with no usage rows still counts as
        reported. ``partition`` None: ``attempts`` and ``acc`` say each row's."""
        if partition is not None:
            attempts = attempts.with_columns(pl.lit(partition, pl.Int64).alias("partition"))
        markers = attempts.select("job_id", "attempt", "partition")
        names = ACC_SCHEMA.names()
        rows = pl.concat([
            acc.join(markers, on=["job_id", "attempt", "partition"], how="semi").select(
                *names, pl.col("partition").alias("shard")),
            markers.select("job_id", "attempt", pl.col("partition").alias("shard")).with_columns(
                *[pl.lit(None, dtype).alias(name) for name, dtype in ACC_SCHEMA.items()
                  if name not in ("job_id", "attempt")]).select(*names, "shard"),
        ], how="vertical_relaxed")
        return rows.cast(dict(ACC_SCHEMA)).with_columns(  # type: ignore[arg-type]
            pl.lit(kind).alias("kind"))

    def receive_parts(self, parts: pl.DataFrame) -> None:
        """Parts sent by other instances (the owner's input from the attempt exchange)."""
        if not self.owner or parts.is_empty():
            return
        parts = conform_parts(parts)
        # the running and end-of-input marks of our own partitions are this engine's;
        # ended parts are taken whoever sent them: a partition this instance holds now
        # may have sent its parts through the topic while another instance owned, and
        # a part this engine took itself is dropped as a repeat (``_take_parts``)
        others = parts.filter(~pl.col("shard").is_in(list(self.held)))
        self.flushed_shards.update(
            others.filter(pl.col("kind") == "flushed")["shard"].to_list())
        running = others.filter(pl.col("kind") == "running")
        for (shard,), rows in running.group_by(["shard"]):
            assert isinstance(shard, int)
            self.running_parts[shard] = rows.filter(pl.col("node").is_not_null())
        self._take_parts(parts.filter(pl.col("kind") == "ended"))
        self._complete_attempts()

    def _take_parts(self, parts: pl.DataFrame) -> None:
        """Keep new parts; a part sent again (a partition replayed after a restart) or one
        of an attempt already written is dropped."""
        if parts.is_empty():
            return
        keys = ["job_id", "attempt", "shard"]
        seen = self.received.select(keys).unique()
        done = pl.DataFrame([{"job_id": j, "attempt": a} for j, a in self.completed],
                            schema={"job_id": pl.String, "attempt": pl.Int64})
        fresh = parts.join(seen, on=keys, how="anti").join(
            done, on=["job_id", "attempt"], how="anti")
        self.received = pl.concat([self.received, fresh])

    def _complete_attempts(self) -> None:
        """Write the waiting attempts whose every partition has reported."""
        if self.waiting.is_empty():
            return
        got: dict[tuple[str, int], set[int]] = {}
        for job, attempt, shard in self.received.select(
                "job_id", "attempt", "shard").unique().iter_rows():
            got.setdefault((job, attempt), set()).add(shard)
        ready = [self.partitions_of(nodes) <= got.get((job, attempt), set())
                 for job, attempt, nodes in self.waiting.select(
                     "job_id", "attempt", "nodes").iter_rows()]
        mask = pl.Series(ready, dtype=pl.Boolean)
        done = self.waiting.filter(mask)
        if done.is_empty():
            return
        self.waiting = self.waiting.filter(~mask)
        keys = ["job_id", "attempt"]
        acc = self.received.join(done.select(keys), on=keys, how="semi")
        self.received = self.received.join(done.select(keys), on=keys, how="anti")
        self._write_attempts(done, acc.filter(pl.col("node").is_not_null()).select(
            ACC_SCHEMA.names()))
        for job, attempt, ended in done.select(*keys, "ended_at").iter_rows():
            self.completed[(job, attempt)] = ended

    def _write_attempts(self, ended: pl.DataFrame, acc: pl.DataFrame) -> None:
        """``job_attempts`` and ``recommendations`` rows of ended attempts."""
        keys = ["job_id", "attempt"]
        facts = self._attempt_facts(ended, acc)
        self._buffer("job_attempts", facts, "ended_at", 0)
        recs = recommendations.for_attempts(facts, self.config)
        if not recs.is_empty():
            recs = recs.join(ended.select(*keys, "ended_at"), on=keys).with_columns(
                pl.col("ended_at").dt.date().alias("date"))
            self._buffer("recommendations", recs, "ended_at", 0)

    def _forget_completed(self, closed_until: datetime) -> None:
        horizon = closed_until - timedelta(seconds=self.config.windows.ended_job_memory_s)
        self.completed = {k: t for k, t in self.completed.items() if t >= horizon}

    def _attempt_facts(self, attempts: pl.DataFrame, acc: pl.DataFrame) -> pl.DataFrame:
        usage = job_usage.card_mismatch(job_usage.attempt_usage(acc, self.config), self.config)
        t = self.config.thresholds
        out = attempts.join(usage, on=["job_id", "attempt"], how="left").with_columns(
            pl.col("ended_at").dt.date().alias("date"),
            *[pl.col(c).fill_null(0.0) for c in (
                "allocated_gpu_hours", "job_gpu_hours", "used_gpu_hours", "idle_gpu_hours",
                "inefficient_gpu_hours", "observed_gpu_hours", "no_telemetry_gpu_hours",
                "waste_gpu_hours", "mismatch_gpu_hours")],
        ).with_columns(
            pl.col("memory_oversized").fill_null(False),
            (pl.col("mem_peak_mib") / pl.col("gpu_mem_mib")).alias("mem_peak_of_requested"),
            pl.lit(t.idle_activity).alias("idle_threshold"),
            pl.lit(t.efficient_activity).alias("efficient_threshold"),
        )
        # gpus_no_telemetry is not stored: the recommendations' evidence reads it
        return out.select(*TABLE_SCHEMAS["job_attempts"].names(),
                          pl.col("gpus_no_telemetry").fill_null(0))

    def _count_sequence(self, telem: pl.DataFrame) -> None:
        gaps = sequence_gaps(telem)
        for part, agent, lo, hi, n in gaps.iter_rows():
            key = (part, agent)
            last = self._seq_last.get(key)
            gap = hi - lo + 1 - n
            if last is not None and lo > last + 1:
                gap += lo - last - 1
            self.counters.telemetry_lost_samples += max(gap, 0)
            self._seq_last[key] = max(hi, last if last is not None else hi)

    # -- buffering and writing -------------------------------------------------------

    def _buffer_split(self, table: str, frame: pl.DataFrame, time_col: str) -> None:
        """Buffer a frame with a ``partition`` column, per partition and hour."""
        if frame.is_empty():
            return
        self._buffer(table, frame, time_col, None)

    def _buffer(self, table: str, frame: pl.DataFrame, time_col: str,
                partition: int | None) -> None:
        """Buffer ``frame``'s rows per hour of ``time_col``, as ``partition``'s (None: each
        row's own ``partition``)."""
        if frame.is_empty():
            return
        parts = frame if partition is None else frame.with_columns(
            pl.lit(partition, pl.Int64).alias("partition"))
        shaped = self._shape(table, parts).with_columns(parts["partition"])
        for listener in self.listeners:
            listener.facts(table, shaped.drop("partition"))
        hour = pl.col(time_col).dt.truncate("1h").alias("_h")
        for (part, when), rows in shaped.with_columns(hour).partition_by(
                ["partition", "_h"], as_dict=True, maintain_order=False).items():
            assert isinstance(part, int) and isinstance(when, datetime)
            self.hour_parts.setdefault((table, when, part), []).append(
                rows.drop("partition", "_h"))

    @staticmethod
    def _shape(table: str, frame: pl.DataFrame) -> pl.DataFrame:
        schema = TABLE_SCHEMAS[table]
        return frame.select(schema.names()).cast(dict(schema))  # type: ignore[arg-type]

    def _write_hours(self, final: bool) -> None:
        closed = self.closed_until
        keys = {(hour, part) for (_, hour, part) in self.hour_parts} | set(self.rollup_parts)
        done = sorted(
            (hour, part) for hour, part in keys
            if final or (closed is not None and hour + timedelta(hours=1) <= closed))
        hourly = self._hourly_rollups(done)
        days: set[tuple[datetime, int]] = set()
        for hour, part in done:
            self._write_hour(hour, part, hourly.get((hour, part)))
            if (hour.replace(hour=0), part) in self.day_hourly:
                days.add((hour.replace(hour=0), part))
        if final and self.partitioning is None and self._run_from is not None:
            days |= set(self.day_hourly)  # each day's last roll-up takes earlier hours
            self._roll_up_days_without_hours()
        daily = self._daily_rollups(days, final)
        for day, part in sorted(days):  # once per day, however many of its hours closed
            self._write_daily(day, part, daily[(day, part)])
        # ended attempts (and the other merged tables) are published by the step that
        # ends them, not when their hour is complete: with the running snapshot of the
        # same step, a reader sees every attempt ended or running, never neither
        written = set(done)
        for table, hour, part in sorted(k for k in self.hour_parts
                                        if k[0] in MERGED_TABLES and k[1:] not in written):
            self._write_table_hour(table, hour, part, complete=False)
        if self._step is not None:
            self._drop_replaced(self._step)

    def _drop_replaced(self, step: tuple[datetime, datetime]) -> None:
        """After a close step of a run that holds every partition: each hour the step
        completed is this run's whole, so what an earlier run over the same hour wrote of
        a table this run has no row of in it goes (an hour without a ``gpu_span`` row in
        this run kept an earlier run's spans of it beside this run's minutes). Merged
        tables wait for the run's end (:meth:`_drop_earlier_rows`)."""
        a, b = step
        whole, hour = [], _floor_hour(a)
        while hour + timedelta(hours=1) <= b:   # the hours this step completed
            whole.append(hour)
            hour += timedelta(hours=1)
        self._drop_unwritten(whole)

    def _drop_unwritten(self, hours: list[datetime]) -> None:
        """Of ``hours``, each table replaced whole by the hour (all but the merged ones,
        and ``gpu_hourly``) that the step being written wrote nothing of keeps none of
        what an earlier run wrote there."""
        tables = [*(t for t in HOURLY_TABLES if t not in MERGED_TABLES), "gpu_hourly"]
        for p in sorted(self.held):
            mine = [t for t in tables if t not in CLUSTER_TABLES or (p == 0 and self.cluster)]
            for hour in hours:
                for table in mine:
                    if (table, hour, p) not in self._step_written:
                        self.warehouse.drop_rows(table, hour, (hour, hour + timedelta(hours=1)),
                                                 SORT_KEYS[table], self.suffix(p))

    def _drop_earlier_rows(self) -> None:
        """At the end of a run that holds every partition: the rows of merged tables that
        earlier runs wrote in the time this run read (after its first step began, at or
        before its newest event) and this run did not write again go. A piece
        ingested on its own (``--afresh``) left attempts there with other end times than
        the whole history's, beside them. Done at the end, not step by step: a late
        end event publishes an attempt a step later, and a reader in between would see
        it gone."""
        # to the newest event read, not the closed point: an end at exactly the minute
        # this run closed to is the next piece's event, which this run never saw
        newest = self.newest_time()
        if self._run_from is None or newest is None or newest <= self._run_from \
                or not self._earlier or self.keep_earlier_rows:
            return
        for table, days in self._earlier.items():
            keys = _run_key(table)
            mine = self._run_keys.get(table)
            written = (pl.concat(mine, how="vertical_relaxed").unique() if mine
                       else pl.DataFrame(schema={k: TABLE_SCHEMAS[table][k] for k in keys}))
            gone = self.warehouse.drop_rows_not_in(table, days, (self._run_from, newest),
                                                   written)
            if gone:
                log.info("%s: %d row(s) an earlier run wrote in the time this run closed, "
                         "and this run did not, taken out", table, gone)

    def _hourly_rollups(self, keys: list[tuple[datetime, int]]
                        ) -> dict[tuple[datetime, int], pl.DataFrame]:
        """``gpu_hourly`` rows of each (hour, partition) of ``keys`` that has partials:
        one roll-up for all of them (the partition is a key of the partials), split."""
        wanted = [key for key in keys if self.rollup_parts.get(key)]
        if not wanted:
            return {}
        rows = rollup.hourly(pl.concat([f for key in wanted for f in self.rollup_parts[key]],
                                       how="vertical_relaxed"))
        return self._split_rollup("gpu_hourly", rows, ["hour", "partition"], wanted)

    def _daily_rollups(self, keys: set[tuple[datetime, int]], final: bool
                       ) -> dict[tuple[datetime, int], pl.DataFrame]:
        """``gpu_daily`` rows of each (day, partition) of ``keys``, from the hourly rows
        kept for the day: one roll-up for all of them, split. A day's last roll-up in
        this run (``final``, or the day closed) also takes the hours earlier runs wrote
        outside this run's time (:meth:`_earlier_hours`)."""
        if not keys:
            return {}
        days: list[pl.DataFrame] = []
        for day, part in sorted(keys):
            kept = self.day_hourly[(day, part)]
            hours = [kept[h] for h in sorted(kept)]
            closed = self.closed_until
            last = final or (closed is not None and day + timedelta(days=1) <= closed)
            earlier = self._earlier_hours(day, set(kept)) if last else None
            if earlier is not None:
                hours.append(earlier)
            days.append(pl.concat(hours).with_columns(
                pl.lit(day).alias("_day"), pl.lit(part, pl.Int64).alias("partition")))
        rows = rollup.daily(pl.concat(days), by=("partition", "_day"))
        return self._split_rollup("gpu_daily", rows, ["_day", "partition"], keys)

    def _earlier_hours(self, day: datetime, mine: set[datetime]) -> pl.DataFrame | None:
        """In a run that holds every partition, the ``gpu_hourly`` rows of ``day`` that an
        earlier run wrote outside the time this run covers (before the hour it started
        in, or from where it has closed to on): a day this run covers in part still
        rolls up every hour of it (re-running the day's first piece left ``gpu_daily``
        with that piece's hours alone, below the sum of ``gpu_hourly``). Taken only for
        the day's last roll-up in the run: a re-run of the same input writes the same
        objects at every step, as the first run did (its sums of unrounded rows and the
        written, rounded ones may differ in the last digit)."""
        closed = self.closed_until
        if self.partitioning is not None or self._run_from is None or closed is None \
                or f"date={day:%Y-%m-%d}" not in self._earlier_hourly:
            return None
        rows = self.warehouse.day_rows("gpu_hourly", day)
        if rows is None:
            return None
        start = _floor_hour(self._run_from)
        hour = pl.col("hour")
        outside = rows.filter(~hour.is_in(list(mine)) & ((hour < start) | (hour >= closed)))
        return self._shape("gpu_hourly", outside) if outside.height else None

    def _roll_up_days_without_hours(self) -> None:
        """At a run's end (a run that holds every partition): a day in the time it covered
        where it wrote no ``gpu_hourly`` row (a piece with no inventory: its hours were
        emptied) is rolled up from the hours earlier runs wrote outside that time, and
        has no ``gpu_daily`` rows when there are none (an earlier run's roll-up stayed
        beside an empty ``gpu_hourly``)."""
        closed = self.closed_until
        assert self._run_from is not None
        if closed is None:
            return
        day = self._run_from.replace(hour=0, minute=0, second=0, microsecond=0)
        while day < closed:
            if (day, 0) not in self.day_hourly and day not in self._days_written:
                earlier = self._earlier_hours(day, set())
                if earlier is None:
                    self.warehouse.drop_part("gpu_daily", day)
                else:
                    rows = rollup.daily(earlier.with_columns(
                        pl.lit(day).alias("_day"), pl.lit(0, pl.Int64).alias("partition")),
                        by=("partition", "_day"))
                    self.warehouse.write_part("gpu_daily", day, self._shape("gpu_daily", rows),
                                              SORT_KEYS["gpu_daily"], hourly=False)
            day += timedelta(days=1)

    def _split_rollup(self, table: str, rows: pl.DataFrame, by: list[str],
                      keys: Collection[tuple[datetime, int]]
                      ) -> dict[tuple[datetime, int], pl.DataFrame]:
        """``rows`` of ``table`` for every partition, per (time, partition) key of
        ``keys``: a key with no row gets an empty frame (its file is written empty)."""
        out: dict[tuple[datetime, int], pl.DataFrame] = {}
        for (when, part), frame in rows.partition_by(by, as_dict=True,
                                                     maintain_order=True).items():
            assert isinstance(when, datetime) and isinstance(part, int)
            out[(when, part)] = self._shape(table, frame)
        assert out.keys() <= set(keys), "a roll-up row of a key not asked for"
        empty = self._shape(table, rows.clear())
        return {key: out.get(key, empty) for key in keys}

    def _write_hour(self, hour: datetime, partition: int,
                    hourly: pl.DataFrame | None) -> None:
        """Write the buffered parts of ``hour`` (partial ones stay buffered); ``hourly``:
        its ``gpu_hourly`` rows, when it has roll-up partials."""
        closed = self.closed_until
        complete = closed is not None and hour + timedelta(hours=1) <= closed
        suffix = self.suffix(partition)
        partials = self.rollup_parts.get((hour, partition))
        if partials:
            assert hourly is not None  # every hour with partials is rolled up
            self.warehouse.write_part("gpu_hourly", hour, hourly, SORT_KEYS["gpu_hourly"],
                                      suffix=suffix)
            if self.partitioning is None:
                self._step_written.add(("gpu_hourly", hour, partition))
            self.day_hourly.setdefault((hour.replace(hour=0), partition), {})[hour] = hourly
            if complete:
                del self.rollup_parts[(hour, partition)]
            else:
                self.rollup_parts[(hour, partition)] = [pl.concat(partials)]
        for table in HOURLY_TABLES:
            self._write_table_hour(table, hour, partition, complete)

    def _write_table_hour(self, table: str, hour: datetime, partition: int,
                          complete: bool) -> None:
        """Write ``table``'s buffered rows of ``hour`` (a merged table's are added to what
        is there; another table's partial hour stays buffered, to be rewritten whole).

        A run that holds every partition keeps the keys of the merged rows it writes
        where earlier runs wrote (:meth:`_drop_earlier_rows`)."""
        key = (table, hour, partition)
        parts = self.hour_parts.get(key)
        if not parts:
            return
        frame = pl.concat(parts, how="vertical_relaxed")
        merge = table in MERGED_TABLES
        self.warehouse.write_part(table, hour, frame, SORT_KEYS[table], merge=merge,
                                  suffix=self.suffix(partition))
        if self.partitioning is None:
            self._step_written.add(key)
        if merge and self._earlier:
            self._run_keys.setdefault(table, []).append(frame.select(_run_key(table)))
        self.counters.add_rows(table, frame.height)
        if complete or merge:
            del self.hour_parts[key]
        else:
            self.hour_parts[key] = [frame]

    def _write_daily(self, day: datetime, partition: int, daily: pl.DataFrame) -> None:
        kept = self.day_hourly[(day, partition)]
        self._days_written.add(day)
        self.warehouse.write_part("gpu_daily", day, daily, SORT_KEYS["gpu_daily"],
                                  hourly=False, suffix=self.suffix(partition))
        closed = self.closed_until
        if closed is not None and day + timedelta(days=1) <= closed and not any(
                (h, p) in self.rollup_parts for h in kept for p in (partition,)):
            del self.day_hourly[(day, partition)]

    def _say_rejected_telemetry(self) -> None:
        """A warning at the end of the input: how many telemetry samples were rejected, and
        why (each is a row of ``rejects``). Only the summary of bad lines said so before:
        an input without inventory records had every sample rejected and printed
        "ingested 414,360 telemetry", exit status 0, and wrote no GPU-minute."""
        c = self.counters
        why = [(c.unplaced_telemetry, "of GPUs no inventory knew (an unknown node or GPU "
                "index)"),
               (c.ahead_telemetry, "too far ahead of the fleet (windows.max_ahead_s)"),
               (c.implausible_telemetry, "using more memory than their card has")]
        total = sum(n for n, _ in why)
        if total <= self._rejected_said:
            return
        self._rejected_said = total
        every = total >= c.records_in["telemetry"] > 0
        log.warning("%s telemetry sample(s) were rejected, not counted in any fact: %s "
                    "(each in the rejects table: SELECT * FROM rejects; docs/metrics.md, "
                    "'Rejected')%s", f"{total:,}",
                    "; ".join(f"{n:,} {what}" for n, what in why if n),
                    ". That is every sample this run read: were the inventory records left "
                    "out? Give them with the telemetry (in the same input, or a piece "
                    "before it)" if every and c.unplaced_telemetry else "")

    def _write_late(self) -> None:
        for (hour, part), parts in sorted(self.late_parts.items()):
            frame = pl.concat(parts, how="vertical_relaxed").with_columns(
                pl.col("minute").dt.date().alias("date")).select(LATE_TELEMETRY.names())
            self.warehouse.write_part("late_telemetry", hour, frame,
                                      SORT_KEYS["late_telemetry"], merge=True,
                                      suffix=self.suffix(part))
        self.late_parts.clear()

    def _write_rejects(self) -> None:
        if not self.rejects:
            return
        rej = pl.concat(self.rejects, how="vertical_relaxed")
        for (part,), rows in rej.group_by("partition"):
            assert isinstance(part, int)
            self.warehouse.write_snapshot("rejects", rows.drop("partition"),
                                          ["source", "line", "reason"], suffix=self.suffix(part))

    def _running_as_of_closed(self) -> pl.DataFrame:
        """The attempts running or pending at the closed point: those that have not
        ended, and those whose end the books know but whose minute is not closed yet (an
        attempt is published as ended by the step that closes its end)."""
        running = self.jobs.running_attempts()
        closed = self.closed_until
        if closed is None:
            return running
        limbo = [a for a in self.jobs.ended_attempts if a["ended_at"] > closed]
        if not limbo:
            return running
        ends = pl.DataFrame(limbo, schema=ATTEMPT_SCHEMA).with_columns(
            pl.lit(None, TIME_DTYPE).alias("ended_at"), pl.lit(None, pl.String).alias("end_event"),
            pl.lit(None, pl.String).alias("reason"), pl.lit(0.0).alias("lost_gpu_hours"))
        return pl.concat([running, ends.select(running.columns)])

    def _snapshot_due(self) -> bool:
        """A live service (``telemetry_clock``) refreshes the running snapshot every
        ``warehouse.snapshot_interval_s``; a history (ingest, import, the demo) writes it
        at its end, so that a re-run never puts an older snapshot over a newer one."""
        if not self.telemetry_clock:
            return False
        interval = self.config.warehouse.snapshot_interval_s
        return self._snapshot_at is None or \
            time.monotonic() - self._snapshot_at >= interval

    def _write_snapshots(self) -> None:
        self._snapshot_at = time.monotonic()
        running = self._running_as_of_closed()
        keys = ["job_id", "attempt"]
        acc = self.acc
        if self.exchanges:
            if not self.owner:  # the owner writes the snapshots, with our parts
                for p in sorted(self.held):
                    self.outbox.append(self._parts(
                        running, acc.filter(pl.col("partition") == p), "running", p))
                return
            remote = [rows.select(ACC_SCHEMA.names()) for p, rows in self.running_parts.items()
                      if p not in self.held]
            acc = pl.concat([acc, *remote])
        usage = job_usage.card_mismatch(
            job_usage.attempt_usage(acc, self.config), self.config)
        snap = running.join(usage, on=keys, how="left").with_columns(
            (pl.col("mem_peak_mib") / pl.col("gpu_mem_mib")).alias("mem_peak_of_requested"))
        suffix = self.suffix(0)
        self.warehouse.write_snapshot("running_attempts", self._shape("running_attempts", snap),
                                      keys, suffix=suffix)
        cands = recommendations.candidates(  # not those whose end is read
            self.jobs.running_attempts(), usage, self.last_free_blocks, LOW_PRIORITY,
            self.closed_until)
        self.warehouse.write_snapshot("candidates", self._shape("candidates", cands),
                                      [*keys, "kind"], suffix=suffix)

    # -- what a listener or the exporter reads -------------------------------------------

    def window_start(self) -> datetime | None:
        """The oldest minute still open anywhere in this engine."""
        return self.closed_until


__all__ = ["HOUR_MS", "TIME_DTYPE", "FactListener", "Processor"]
