"""What the exporter keeps: the latest closed minute's facts and a little state.

:class:`FactSnapshots` is a processor :class:`~gpuledger.pipeline.processor.FactListener`.
As a close step's fact frames arrive it holds them; when the step ends it keeps, as one
immutable :class:`Snapshot`, the rows of the step's last minute plus copies of the
processor state the per-job gauges need (open allocations, job attributes, usage
accumulators, pending jobs). Collectors read the current snapshot at scrape time from
the HTTP server's thread; the processor thread replaces it whole, so a scrape sees one
consistent minute.

It also keeps what spans minutes: each node's last minute with telemetry, and the
queue-wait histogram (observed when an attempt starts).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import polars as pl

from gpuledger.pipeline.columns import TIME_DTYPE
from gpuledger.pipeline.exporter.families import label_exprs
from gpuledger.pipeline.exporter.histogram import Histogram
from gpuledger.pipeline.facts.minutes import expand_to_minutes

if TYPE_CHECKING:
    from gpuledger.pipeline.processor import Processor

KEPT_TABLES = ("gpu_minute", "frag_minute", "pending_minute", "blocked_minute")
QUEUE_LABELS = ["queue", "pool", "requested_card_type", "team"]
"""Labels of the queue series: ``requested_card_type`` is the job's ``card_type`` column."""
QUEUE_WAIT_BUCKETS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0,
                      14_400.0, 28_800.0, 86_400.0)
NODE_SEEN_SCHEMA = {"node": pl.String(), "last_seen": TIME_DTYPE}


@dataclass(frozen=True)
class Snapshot:
    """The latest closed minute, as frames (empty before the first close)."""

    minute: datetime | None = None
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)
    allocations: pl.DataFrame = field(default_factory=pl.DataFrame)
    """Allocations covering the minute: job_id, attempt, node, gpu_index, fraction, start."""
    attributes: pl.DataFrame = field(default_factory=pl.DataFrame)
    usage: pl.DataFrame = field(default_factory=pl.DataFrame)
    """The processor's per-GPU usage accumulators (``job_usage.ACC_SCHEMA``)."""
    pending: pl.DataFrame = field(default_factory=pl.DataFrame)
    """Attempts pending at the minute's end: job_id, attempt, queued_at + attributes."""
    node_seen: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(
        schema=NODE_SEEN_SCHEMA))

    def table(self, name: str) -> pl.DataFrame:
        return self.tables.get(name, pl.DataFrame())

    @property
    def until(self) -> datetime | None:
        return None if self.minute is None else self.minute + timedelta(minutes=1)


def merge(snaps: list[Snapshot]) -> Snapshot:
    """One snapshot from the shards' (processors') snapshots of one instance.

    Shards own disjoint nodes: their GPU rows, usage and node clocks are put together;
    the cluster-wide tables come from the shard that writes them; the job book (the
    same on every shard) from the shard that has closed the newest minute. The minute
    is the oldest shard's: every shard has closed it.
    """
    live = [s for s in snaps if s.minute is not None]
    if len(live) <= 1:
        return live[0] if live else Snapshot()
    newest = max(live, key=lambda s: s.minute or datetime.min)
    tables: dict[str, pl.DataFrame] = {}
    for name in KEPT_TABLES:
        parts = [s.tables[name] for s in live if name in s.tables]
        if parts:
            tables[name] = pl.concat(parts, how="vertical_relaxed")
    usage = [s.usage for s in live if not s.usage.is_empty()]
    return Snapshot(
        minute=min(s.minute for s in live if s.minute is not None), tables=tables,
        allocations=newest.allocations, attributes=newest.attributes, pending=newest.pending,
        usage=pl.concat(usage, how="vertical_relaxed") if usage else pl.DataFrame(),
        node_seen=pl.concat([s.node_seen for s in live]).group_by("node").agg(
            pl.col("last_seen").max()))


class FactSnapshots:
    """Listener that keeps the latest :class:`Snapshot` of one processor.

    ``queue_wait``: the instance's histogram, fed only when ``observe_waits`` (the
    processor that writes the cluster-wide facts: every shard sees every job).
    """

    def __init__(self, queue_wait: Histogram | None = None, lock: threading.Lock | None = None,
                 observe_waits: bool = True) -> None:
        self.snapshot = Snapshot()
        self.queue_wait = queue_wait or Histogram(QUEUE_LABELS, QUEUE_WAIT_BUCKETS)
        self.lock = lock or threading.Lock()
        self.observe_waits = observe_waits
        self._step: dict[str, list[pl.DataFrame]] = {}
        self._node_seen = pl.DataFrame(schema=NODE_SEEN_SCHEMA)
        self._waits_seen: set[tuple[str, int]] = set()

    # -- FactListener --------------------------------------------------------------

    def facts(self, table: str, frame: pl.DataFrame) -> None:
        if table in KEPT_TABLES or table == "job_attempts":
            self._step.setdefault(table, []).append(frame)

    def closed(self, processor: Processor, until: datetime) -> None:
        step, self._step = self._step, {}
        minute = until - timedelta(minutes=1)
        lit = pl.lit(minute).cast(TIME_DTYPE)
        tables: dict[str, pl.DataFrame] = {}
        for name in KEPT_TABLES:
            parts = step.get(name)
            if parts:
                tables[name] = pl.concat(parts, how="vertical_relaxed").filter(
                    pl.col("minute") == lit)
        if "gpu_minute" in step:
            self._track_nodes(pl.concat(step["gpu_minute"], how="vertical_relaxed"))
        allocs = expand_to_minutes(processor.jobs.allocations(), "start", "end", minute, until)
        attrs = processor.jobs.attributes()
        attempts = processor.jobs.running_attempts()
        pending = attempts.filter(
            pl.col("started_at").is_null() & (pl.col("queued_at") < pl.lit(until).cast(TIME_DTYPE)))
        if self.observe_waits:
            self._observe_waits(attempts, step.get("job_attempts", []), until)
        snap = Snapshot(minute=minute, tables=tables, allocations=allocs.drop("minute"),
                        attributes=attrs, usage=processor.acc, pending=pending,
                        node_seen=self._node_seen)
        self.snapshot = snap

    # -- state across minutes -------------------------------------------------------

    def _track_nodes(self, gpu: pl.DataFrame) -> None:
        seen = gpu.filter(pl.col("telemetry_samples") > 0).group_by("node").agg(
            pl.col("minute").max().alias("last_seen"))
        if seen.is_empty():
            return
        both = pl.concat([self._node_seen, seen.cast(NODE_SEEN_SCHEMA)])  # type: ignore[arg-type]
        self._node_seen = both.group_by("node").agg(pl.col("last_seen").max())

    def _observe_waits(self, attempts: pl.DataFrame, ended: list[pl.DataFrame],
                       until: datetime) -> None:
        """Observe each attempt's queue wait once, when it has started before ``until``.

        Running attempts are seen in the job book; attempts that started and ended
        between two close steps are seen in the ``job_attempts`` facts. An attempt
        observed while running is forgotten when its facts arrive, so the set of
        remembered attempts stays as small as the running set.
        """
        cols = ["job_id", "attempt", "started_at", "queue_wait_s", "queue", "pool", "card_type",
                "team"]
        started = attempts.filter(pl.col("started_at").is_not_null()
                                  & (pl.col("started_at") < pl.lit(until).cast(TIME_DTYPE)))
        frames = [started.select(cols)]
        done_keys: set[tuple[str, int]] = set()
        if ended:
            facts = pl.concat(ended, how="vertical_relaxed")
            done_keys = set(facts.select("job_id", "attempt").iter_rows())
            frames.append(facts.filter(pl.col("started_at").is_not_null()).select(cols))
        rows = pl.concat(frames, how="vertical_relaxed").unique(["job_id", "attempt"])
        seen = self._waits_seen
        if seen:
            known = pl.DataFrame(list(seen), schema={"job_id": pl.String, "attempt": pl.Int64},
                                 orient="row")
            rows = rows.join(known, on=["job_id", "attempt"], how="anti")
        if not rows.is_empty():
            with self.lock:
                self.queue_wait.observe(rows.rename({"card_type": "requested_card_type"})
                                        .with_columns(label_exprs(QUEUE_LABELS, any_card=True)),
                                        "queue_wait_s")
            seen.update(rows.select("job_id", "attempt").iter_rows())
        seen.difference_update(done_keys)
