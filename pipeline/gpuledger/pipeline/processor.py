"""The processor: micro-batches of events in, one-minute facts out.

Event time drives everything. Each batch (a dict of Polars frames, one per record
type) is validated, applied to state, and buffered; then every minute that the
*watermark* has passed is closed, turning into facts in one columnar pass.

Windows, watermark and lateness (the documented policy):

- The watermark is the newest telemetry time seen minus ``allowed_lateness_s``
  (default 120 s); before any telemetry has been seen (history imports) it is the
  newest scheduler/inventory time minus the same lateness. Minutes that end at or
  before the watermark close, oldest first.
- Out-of-order events inside open minutes are simply sorted in. Duplicated samples
  (same node, GPU, MIG instance, time) count once; duplicated job events (same job,
  event, time) are ignored; inventory records are states, so repeats are harmless.
- *Late* telemetry (its minute already closed) is never dropped silently: it is
  counted and written to the ``late_telemetry`` table, and the closed facts are not
  rewritten. Late job and inventory events still update state (so later minutes and
  job facts are right) and are counted.
- At the end of input (:meth:`Processor.flush`) every minute up to the newest event is
  closed and partial hours are written; running jobs go to the snapshot tables.

Scale-out: with a :class:`~gpuledger.pipeline.shard.Shard`, the processor is one of
several, one per telemetry partition; ``shard.py`` says who writes what.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol

import polars as pl

from gpuledger.contract.schema import RecordType
from gpuledger.pipeline.bus import Batch
from gpuledger.pipeline.columns import TIME_DTYPE, conform
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.counters import Counters
from gpuledger.pipeline.facts import demand, job_usage, recommendations, rollup
from gpuledger.pipeline.facts.fragmentation import fragmentation, node_free_gpus
from gpuledger.pipeline.facts.gpu_state import classify
from gpuledger.pipeline.facts.minutes import expand_to_minutes, minute_range
from gpuledger.pipeline.facts.telemetry_minutes import (
    job_memory,
    per_gpu_minute,
    prepare,
    sequence_gaps,
)
from gpuledger.pipeline.shard import Shard
from gpuledger.pipeline.state.inventory import InventoryBook
from gpuledger.pipeline.state.jobs import ATTEMPT_SCHEMA, JobBook
from gpuledger.pipeline.tables import SORT_KEYS, TABLE_SCHEMAS
from gpuledger.pipeline.validate import validate
from gpuledger.pipeline.warehouse import Warehouse

log = logging.getLogger("gpuledger.processor")

HOURLY_TABLES = ("gpu_minute", "frag_minute", "pending_minute", "blocked_minute",
                 "job_attempts", "job_gpu", "preemptions", "recommendations")
MERGED_TABLES = ("job_attempts", "job_gpu", "preemptions", "recommendations")
LOW_PRIORITY = 10
# An attempt's accumulator rows as one shard sends them to the owner (``shard.py``).
ACC_SCHEMA = job_usage.ACC_SCHEMA
PARTS_SCHEMA = pl.Schema([*ACC_SCHEMA.items(), ("shard", pl.Int64()), ("kind", pl.String())])


def _per_gpu(allocs: pl.DataFrame) -> pl.DataFrame:
    """Allocation per GPU-minute: the fraction held, and the main job on it."""
    return allocs.sort(["fraction", "job_id"], descending=[True, False]).group_by(
        ["minute", "node", "gpu_index"]).agg(
        pl.col("fraction").sum().alias("alloc_fraction"),
        pl.col("job_id").first(),
        pl.col("attempt").first(),
        pl.len().cast(pl.Int64).alias("jobs_on_gpu"),
    )


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


class FactListener(Protocol):
    """Something that follows the facts as windows close (the Prometheus exporter, the
    alert engine). Listeners are not part of the checkpointed state."""

    def facts(self, table: str, frame: pl.DataFrame) -> None:
        """Rows of ``table`` (a name in ``TABLE_SCHEMAS``) closed just now."""

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
        shard: Shard | None = None,
    ) -> None:
        """``telemetry_clock``: only telemetry moves the watermark (a live service, where
        scheduler events may be read ahead of telemetry); off, scheduler and inventory
        time moves it until telemetry is seen (history imports without telemetry).
        ``shard``: this processor is one of several, one per telemetry partition
        (``shard.py``); without it, it is the only one."""
        self.config = config
        self.shard = shard
        self.cluster = config.cluster_facts and (shard is None or shard.owner)
        self.telemetry_clock = telemetry_clock
        self.warehouse = warehouse
        self.counters = Counters()
        self._now = now or (lambda: datetime.now(UTC))
        self.inventory = InventoryBook()
        self.jobs = JobBook(config.windows.ended_job_memory_s)
        self.samples = pl.DataFrame()
        self.acc = pl.DataFrame(schema=job_usage.ACC_SCHEMA)
        self.closed_until: datetime | None = None
        self.max_telemetry_time: datetime | None = None
        self.max_other_time: datetime | None = None
        self.hour_parts: dict[tuple[str, datetime], list[pl.DataFrame]] = {}
        self.day_hourly: dict[datetime, dict[datetime, pl.DataFrame]] = {}
        self.late_parts: dict[datetime, list[pl.DataFrame]] = {}
        self.rejects: list[pl.DataFrame] = []
        self.last_free_blocks = pl.DataFrame(
            schema={"pool": pl.String, "card_type": pl.String, "largest_free_block": pl.Int64})
        self._seq_last: dict[str, int] = {}
        self.node_time: dict[str, datetime] = {}
        self.listeners: list[FactListener] = []
        # the attempt exchange (several shards): parts to send, and at the owner the
        # ended attempts waiting for parts, the parts received, the attempts done
        self.outbox: list[pl.DataFrame] = []
        self.waiting = pl.DataFrame(schema=ATTEMPT_SCHEMA)
        self.received = pl.DataFrame(schema=PARTS_SCHEMA)
        self.completed: dict[tuple[str, int], datetime] = {}
        self.running_parts: dict[int, pl.DataFrame] = {}
        self.flushed_shards: set[int] = set()
        """Shards whose end-of-input flush the owner has seen (this run; not checkpointed)."""
        self.close_pending = False
        """Minutes the watermark has passed wait to be closed (catching up, see
        :meth:`advance`)."""
        self._last_close = time.monotonic()
        for table, schema in TABLE_SCHEMAS.items():
            warehouse.ensure_schema(table, schema)

    # -- input ---------------------------------------------------------------------

    def process(self, batch: Batch, validated: bool = False,
                event_time_limit: datetime | None = None, behind: bool = False) -> None:
        """Take one micro-batch; close every minute the watermark has passed.

        ``event_time_limit`` caps the watermark: a transport reading several partitions
        passes a bound of the event times still unread in them, so that a partition
        read ahead of the others cannot make the others' samples late. ``behind``: more
        input is already waiting (see :meth:`advance`).
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
                if not bad.is_empty():
                    self.rejects.append(bad)
                    self.counters.add_rejects(record_type, bad.height)
            self.counters.records_in[record_type] += frame.height
            if not good.is_empty():
                frames[record_type] = good
        self._ingest(frames)
        self.advance(event_time_limit, behind)

    def add_rejects(self, rejects: pl.DataFrame) -> None:
        """Record rejects found before the processor (e.g. by the JSON decoder)."""
        if rejects.is_empty():
            return
        self.rejects.append(rejects)
        for (record_type,), group in rejects.group_by(["record_type"]):
            kind = "unknown" if record_type is None else str(record_type)
            self.counters.add_rejects(kind, group.height)

    def _ingest(self, frames: dict[RecordType, pl.DataFrame]) -> None:
        clocks = {k: f for k, f in frames.items()
                  if k == "telemetry" or not self.telemetry_clock}
        times = [f.select(pl.col("time").min()).item() for f in clocks.values()]
        if self.closed_until is None and times:
            self.closed_until = _floor_minute(min(times))
        closed = self.closed_until
        if "inventory" in frames:
            inv = frames["inventory"]
            if closed is not None:
                self.counters.late_inventory += inv.filter(pl.col("time") < closed).height
            self._bump_other(inv)
            if self.shard is not None and not self.cluster:
                inv = self.shard.mine(inv)  # the GPU grid of this shard's nodes only
            self.inventory.apply(inv)
        if "job" in frames:
            jobs = frames["job"]
            if closed is not None:
                self.counters.late_job_events += jobs.filter(pl.col("time") < closed).height
            self.jobs.apply(jobs)
            self.counters.duplicate_job_events = self.jobs.counters.duplicates
            self.counters.out_of_order_job_events = self.jobs.counters.out_of_order
            self._bump_other(jobs)
        if "telemetry" in frames:
            tel = frames["telemetry"]
            if self.shard is not None:
                mine = self.shard.mine(tel)
                if mine.height < tel.height:
                    self.counters.misrouted_telemetry += tel.height - mine.height
                    log.warning("%d telemetry sample(s) for nodes of other partitions "
                                "dropped (producers must use Kafka's default murmur2 "
                                "partitioner, keyed by node)", tel.height - mine.height)
                if mine.is_empty():
                    return
                tel = mine
            tel = prepare(tel)
            newest = tel.select(pl.col("time").max()).item()
            if self.max_telemetry_time is None or newest > self.max_telemetry_time:
                self.max_telemetry_time = newest
            for node, when in tel.group_by("node").agg(pl.col("time").max()).iter_rows():
                old = self.node_time.get(node)
                if old is None or when > old:
                    self.node_time[node] = when
            assert closed is not None
            cutoff = pl.lit(closed).cast(TIME_DTYPE)
            late = tel.filter(pl.col("minute") < cutoff)
            if not late.is_empty():
                self.counters.late_telemetry += late.height
                for (hour,), part in late.group_by(
                        pl.col("minute").dt.truncate("1h").alias("h")):
                    assert isinstance(hour, datetime)
                    self.late_parts.setdefault(hour, []).append(
                        part.drop("activity", "n_proc", "n_unattributed"))
            fresh = tel.filter(pl.col("minute") >= cutoff)
            self.samples = fresh if self.samples.is_empty() else pl.concat([self.samples, fresh])

    def _bump_other(self, frame: pl.DataFrame) -> None:
        newest = frame.select(pl.col("time").max()).item()
        if self.max_other_time is None or newest > self.max_other_time:
            self.max_other_time = newest

    def _watermark(self, catching_up: bool = False) -> datetime | None:
        w = self.config.windows
        lateness = timedelta(seconds=w.allowed_lateness_s)
        newest = self.max_telemetry_time
        if newest is not None and self.node_time:
            # the slowest node still reporting holds the windows open; catching up, a
            # node may be read up to a close step behind the others (messages spanning
            # minutes) and still hold them
            stall = timedelta(seconds=w.node_stall_s)
            if catching_up:
                stall = max(stall, timedelta(minutes=w.catchup_close_minutes))
            horizon = newest - stall
            self.node_time = {n: t for n, t in self.node_time.items() if t >= horizon}
            newest = min(self.node_time.values(), default=newest)
        if newest is None and not self.telemetry_clock:
            newest = self.max_other_time
        return None if newest is None else newest - lateness

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
        if mark is None or self.closed_until is None:
            return
        if limit is not None:
            mark = min(mark, limit - timedelta(seconds=w.allowed_lateness_s))
        end = _floor_minute(mark)
        if end <= self.closed_until:
            return
        if catching_up and time.monotonic() - self._last_close < w.catchup_close_interval_s:
            step = _floor_step(end, w.catchup_close_minutes)
            if step <= self.closed_until:
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
        if self.shard is None:  # a sharded service publishes the catalog once, at start
            self.warehouse.publish_catalog()

    def flush(self) -> None:
        """End of input: close every minute up to the newest event, write everything."""
        newest = max((t for t in (self.max_telemetry_time, self.max_other_time) if t),
                     default=None)
        if newest is not None and self.closed_until is not None:
            # every minute that holds an event: up to the newest event, rounded up
            end = _floor_minute(newest)
            if end < newest:
                end += timedelta(minutes=1)
            self.close_until(end)
        self._write_hours(final=True)
        self._write_late()
        self._write_snapshots()
        if self.shard is not None and self.shard.exchanges and not self.shard.owner:
            # tell the owner this shard's last parts are sent (batch runs wait for it)
            self.outbox.append(pl.DataFrame(
                {"shard": [self.shard.partition], "kind": ["flushed"]}).with_columns(
                *[pl.lit(None, dtype).alias(name) for name, dtype in ACC_SCHEMA.items()]
            ).select(PARTS_SCHEMA.names()))
        if self.rejects:
            rej = pl.concat(self.rejects, how="vertical_relaxed")
            self.warehouse.write_snapshot("rejects", rej, ["source", "line", "reason"])
        if self.shard is None:  # a sharded service publishes the catalog once, at start
            self.warehouse.publish_catalog()

    # -- closing minutes -------------------------------------------------------------

    def close_until(self, end: datetime) -> None:
        """Close all minutes before ``end``, at most an hour per step."""
        assert self.closed_until is not None
        while self.closed_until < end:
            start = self.closed_until
            step_end = min(end, _floor_hour(start) + timedelta(hours=1))
            self._close(start, step_end)
            self.closed_until = step_end
            for listener in self.listeners:
                listener.closed(self, step_end)
            self._write_hours(final=False)
            if self.late_parts:  # durable now, not held in memory until the stop
                self._write_late()
            self.jobs.prune(step_end)
            self._forget_completed(step_end)
            self.inventory.prune(step_end)

    def _close(self, a: datetime, b: datetime) -> None:
        minutes = minute_range(a, b)
        self.counters.minutes_closed += minutes.len()
        self.counters.close_passes += 1
        lo, hi = pl.lit(a).cast(TIME_DTYPE), pl.lit(b).cast(TIME_DTYPE)
        if self.samples.is_empty():
            window = self.samples
        else:
            in_window = (pl.col("minute") >= lo) & (pl.col("minute") < hi)
            window = self.samples.filter(in_window)
            self.samples = self.samples.filter(~in_window)
        grid = self.inventory.gpus_at(minutes)
        held = self.jobs.allocations()
        if self.shard is not None and not self.cluster:
            held = self.shard.mine(held)  # before expanding them to minutes
        allocs = expand_to_minutes(held, "start", "end", a, b)
        attrs = self.jobs.attributes()
        if self.cluster:  # cluster-wide: every node, whatever the shard
            self._cluster_facts(grid, _per_gpu(allocs), attrs, minutes, a, b)
        if self.shard is not None:  # per-GPU facts: this shard's nodes only
            grid, allocs = self.shard.mine(grid), self.shard.mine(allocs)
        alloc_gpu = _per_gpu(allocs)
        telem = per_gpu_minute(window) if not window.is_empty() else None
        if telem is not None:
            self._count_sequence(telem)
        gpu = self._gpu_minutes(grid, alloc_gpu, telem, attrs)
        self._buffer("gpu_minute", gpu)
        self._job_usage(allocs, gpu, window)
        self._finish_attempts(b)

    def _gpu_minutes(
        self, grid: pl.DataFrame, alloc_gpu: pl.DataFrame, telem: pl.DataFrame | None,
        attrs: pl.DataFrame,
    ) -> pl.DataFrame:
        keys = ["minute", "node", "gpu_index"]
        base = grid.lazy().join(alloc_gpu.lazy(), on=keys, how="full", coalesce=True)
        if telem is not None:
            base = base.join(telem.lazy(), on=keys, how="full", coalesce=True)
        else:
            base = base.with_columns(
                pl.lit(None, pl.Int64).alias("telemetry_samples"),
                pl.lit(None, pl.String).alias("telemetry_card_type"),
                pl.lit(None, pl.Float64).alias("activity"),
                *[pl.lit(None, pl.Float64).alias(c) for c in (
                    "util_gpu", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
                    "power_w", "sm_clock_mhz", "pcie_rx_bytes_s", "pcie_tx_bytes_s",
                    "nvlink_rx_bytes_s", "nvlink_tx_bytes_s", "mem_used_mib",
                    "mem_total_mib", "temp_c")],
                *[pl.lit(None, pl.Int64).alias(c) for c in (
                    "xid_errors", "ecc_sbe", "ecc_dbe", "processes",
                    "unattributed_processes")],
                pl.lit(None, pl.Boolean).alias("telemetry_unhealthy"),
            )
        t = self.config.thresholds
        out = base.with_columns(
            pl.coalesce(pl.col("card_type"), pl.col("telemetry_card_type")).alias("card_type"),
            pl.col("pool").fill_null("unknown"),
            pl.col("schedulable").fill_null(True),
            (pl.col("alloc_fraction").fill_null(0.0) > 0).alias("allocated"),
            (
                (pl.col("health") == "down").fill_null(False)
                | pl.col("gpu_unhealthy").fill_null(False)
                | pl.col("telemetry_unhealthy").fill_null(False)
            ).alias("unhealthy"),
            (pl.col("processes").fill_null(0) > 0).alias("has_process"),
            pl.col("telemetry_samples").fill_null(0),
        ).with_columns(classify(t)).join(
            attrs.lazy().select("job_id", "team", "queue", "job_type", "user", "priority"),
            on="job_id", how="left",
        )
        return out.with_columns(
            pl.col("minute").dt.date().alias("date"),
            pl.lit(t.idle_activity).alias("idle_threshold"),
            pl.lit(t.efficient_activity).alias("efficient_threshold"),
        ).select(TABLE_SCHEMAS["gpu_minute"].names()).collect()

    def _cluster_facts(
        self, grid: pl.DataFrame, alloc_gpu: pl.DataFrame, attrs: pl.DataFrame,
        minutes: pl.Series, a: datetime, b: datetime,
    ) -> None:
        keys = ["minute", "node", "gpu_index"]
        state = grid.join(alloc_gpu.select(*keys, "alloc_fraction"), on=keys, how="left")
        node_ok = pl.col("schedulable") & (pl.col("health") != "down")
        state = state.with_columns(
            node_ok.alias("node_ok"),
            (node_ok & ~pl.col("gpu_unhealthy") & pl.col("alloc_fraction").is_null())
            .alias("cluster_free"),
        )
        nodes = node_free_gpus(state)
        frag = fragmentation(nodes)
        if not frag.is_empty():
            last = frag.filter(pl.col("minute") == pl.col("minute").max())
            self.last_free_blocks = last.select("pool", "card_type", "largest_free_block")
        pend = expand_to_minutes(self.jobs.pending(), "queued_at", "end", a, b).join(
            attrs.select("job_id", "team", "queue", "pool", "card_type", "gpus", "priority"),
            on="job_id", how="left",
        ).with_columns(pl.col("gpus").fill_null(1))
        blocked = demand.blocked_jobs(pend.select(
            "minute", "job_id", "attempt", "team", "queue", "pool", "card_type", "gpus",
            "priority"), nodes)
        starts = self.jobs.started_size_weights(a - timedelta(days=1), b)
        weighted = demand.demand_weighted(pend, starts, nodes,
                                          minutes)
        # a job that accepts any card type is demand on each card type of its pool
        cards = nodes.select("minute", "pool", "card_type").unique()
        counts = demand.any_card_to_each(blocked, cards).group_by(
            ["minute", "pool", "card_type"]).agg(
            pl.len().cast(pl.Int64).alias("pending_jobs"),
            pl.col("gpus").sum().alias("pending_gpus"),
            pl.col("blocked").sum().cast(pl.Int64).alias("blocked_jobs"),
            pl.when(pl.col("blocked")).then(pl.col("gpus")).otherwise(0).sum()
            .alias("blocked_gpus"),
        )
        frag_out = (
            frag.join(weighted, on=["minute", "pool", "card_type"], how="left")
            .join(counts, on=["minute", "pool", "card_type"], how="left")
            .with_columns(pl.col(c).fill_null(0) for c in (
                "pending_jobs", "pending_gpus", "blocked_jobs", "blocked_gpus"))
            .with_columns(pl.col("minute").dt.date().alias("date"))
        )
        self._buffer("frag_minute", frag_out.select(TABLE_SCHEMAS["frag_minute"].names()))
        pending_out = blocked.group_by(["minute", "queue", "pool", "card_type", "team"]).agg(
            pl.len().cast(pl.Int64).alias("pending_jobs"),
            pl.col("gpus").sum().alias("pending_gpus"),
            pl.col("blocked").sum().cast(pl.Int64).alias("blocked_jobs"),
            pl.when(pl.col("blocked")).then(pl.col("gpus")).otherwise(0).sum()
            .alias("blocked_gpus"),
        ).with_columns(pl.col("minute").dt.date().alias("date"))
        self._buffer("pending_minute", pending_out.select(TABLE_SCHEMAS["pending_minute"].names()))
        blocked_out = blocked.filter(pl.col("blocked")).with_columns(
            pl.col("minute").dt.date().alias("date"))
        self._buffer("blocked_minute", blocked_out.select(TABLE_SCHEMAS["blocked_minute"].names()))

    def _job_usage(self, allocs: pl.DataFrame, gpu: pl.DataFrame, window: pl.DataFrame) -> None:
        if allocs.is_empty():
            return
        keys = ["minute", "node", "gpu_index"]
        ctx = gpu.select(*keys, "activity", "card_type", "mem_used_mib", "telemetry_samples",
                         pl.col("mem_total_mib").alias("_tel_total"))
        inv = self.inventory.records.group_by("node").agg(pl.col("gpu_mem_mib").last())
        rows = allocs.join(ctx, on=keys, how="left").join(inv, on="node", how="left").with_columns(
            pl.when(pl.col("telemetry_samples") > 0).then(pl.col("activity"))
            .alias("activity"),
            pl.coalesce(pl.col("gpu_mem_mib"), pl.col("_tel_total")).alias("gpu_mem_total_mib"),
        )
        shared = rows.filter(pl.col("fraction") < 1.0)
        if not shared.is_empty() and not window.is_empty():
            mem = job_memory(window.join(shared.select(keys).unique(), on=keys, how="semi"))
            rows = rows.join(mem, on=[*keys, "job_id"], how="left")
        else:
            rows = rows.with_columns(pl.lit(None, pl.Float64).alias("job_mem_mib"))
        inc = job_usage.minute_usage(rows, self.config)
        self.acc = job_usage.merge(self.acc, inc)

    def _finish_attempts(self, b: datetime) -> None:
        ended = self.jobs.take_ended_attempts(b)
        pre = self.jobs.take_preemptions(b)
        if not pre.is_empty() and self.cluster:
            self._buffer_by_hour("preemptions", pre.with_columns(
                pl.col("time").dt.date().alias("date")), "time")
        if ended.is_empty():
            return
        keys = ["job_id", "attempt"]
        mine = self.acc.join(ended.select(keys), on=keys, how="semi")
        self.acc = self.acc.join(ended.select(keys), on=keys, how="anti")
        gpus = job_usage.per_gpu(mine).join(ended.select(*keys, "ended_at"), on=keys)
        self._buffer_by_hour("job_gpu", gpus.with_columns(
            pl.col("ended_at").dt.date().alias("date")).select(
            TABLE_SCHEMAS["job_gpu"].names()), "ended_at")
        if self.shard is None or not self.shard.exchanges:
            self._write_attempts(ended, mine)
            return
        parts = self._parts(ended, mine, "ended")
        if self.shard.owner:
            self.waiting = pl.concat([self.waiting, ended])
            self._take_parts(parts)
            self._complete_attempts()
        elif not parts.is_empty():
            self.outbox.append(parts)

    def _write_attempts(self, ended: pl.DataFrame, acc: pl.DataFrame) -> None:
        """``job_attempts`` and ``recommendations`` rows of ended attempts."""
        keys = ["job_id", "attempt"]
        facts = self._attempt_facts(ended, acc)
        self._buffer_by_hour("job_attempts", facts, "ended_at")
        recs = recommendations.for_attempts(facts, self.config)
        if not recs.is_empty():
            recs = recs.join(ended.select(*keys, "ended_at"), on=keys).with_columns(
                pl.col("ended_at").dt.date().alias("date"))
            self._buffer_by_hour("recommendations", recs.select(
                TABLE_SCHEMAS["recommendations"].names()), "ended_at")

    # -- the attempt exchange (several shards) -------------------------------------------

    def _parts(self, attempts: pl.DataFrame, acc: pl.DataFrame, kind: str) -> pl.DataFrame:
        """This shard's part of ``attempts``: its accumulator rows, plus one marker row
        (node null) per attempt that has a GPU on this shard, so that an attempt with
        no usage rows still counts as reported."""
        assert self.shard is not None
        shard = self.shard
        expected = [shard.partition in shard.shards_of(n)
                    for n in attempts["nodes"].to_list()]
        markers = attempts.filter(pl.Series(expected, dtype=pl.Boolean)).select(
            "job_id", "attempt")
        rows = pl.concat([
            acc.join(markers, on=["job_id", "attempt"], how="semi"),
            markers.with_columns(*[pl.lit(None, dtype).alias(name)
                                   for name, dtype in ACC_SCHEMA.items()
                                   if name not in ("job_id", "attempt")]),
        ], how="vertical_relaxed")
        return rows.select(ACC_SCHEMA.names()).cast(dict(ACC_SCHEMA)).with_columns(  # type: ignore[arg-type]
            pl.lit(shard.partition, pl.Int64).alias("shard"), pl.lit(kind).alias("kind"))

    def receive_parts(self, parts: pl.DataFrame) -> None:
        """Parts sent by other shards (the owner's input from the attempt exchange)."""
        if self.shard is None or not self.shard.owner or parts.is_empty():
            return
        parts = parts.select(PARTS_SCHEMA.names()).cast(dict(PARTS_SCHEMA))  # type: ignore[arg-type]
        self.flushed_shards.update(
            parts.filter(pl.col("kind") == "flushed")["shard"].to_list())
        running = parts.filter(pl.col("kind") == "running")
        for (shard,), rows in running.group_by(["shard"]):
            assert isinstance(shard, int)
            self.running_parts[shard] = rows.filter(pl.col("node").is_not_null())
        self._take_parts(parts.filter(pl.col("kind") == "ended"))
        self._complete_attempts()

    def _take_parts(self, parts: pl.DataFrame) -> None:
        """Keep new parts; a part sent again (a shard replaying after a restart) or one of
        an attempt already written is dropped."""
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
        """Write the waiting attempts whose every shard has reported."""
        assert self.shard is not None
        if self.waiting.is_empty():
            return
        got: dict[tuple[str, int], set[int]] = {}
        for job, attempt, shard in self.received.select(
                "job_id", "attempt", "shard").unique().iter_rows():
            got.setdefault((job, attempt), set()).add(shard)
        ready = [self.shard.shards_of(nodes) <= got.get((job, attempt), set())
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

    def _forget_completed(self, closed_until: datetime) -> None:
        horizon = closed_until - timedelta(seconds=self.config.windows.ended_job_memory_s)
        self.completed = {k: t for k, t in self.completed.items() if t >= horizon}

    def _attempt_facts(self, attempts: pl.DataFrame, acc: pl.DataFrame) -> pl.DataFrame:
        usage = job_usage.card_mismatch(job_usage.attempt_usage(acc, self.config), self.config)
        t = self.config.thresholds
        out = attempts.join(usage, on=["job_id", "attempt"], how="left").with_columns(
            pl.col("ended_at").dt.date().alias("date"),
            *[pl.col(c).fill_null(0.0) for c in (
                "allocated_gpu_hours", "used_gpu_hours", "idle_gpu_hours",
                "inefficient_gpu_hours", "observed_gpu_hours", "waste_gpu_hours",
                "mismatch_gpu_hours")],
        ).with_columns(
            pl.col("memory_oversized").fill_null(False),
            (pl.col("mem_peak_mib") / pl.col("gpu_mem_mib")).alias("mem_peak_of_requested"),
            pl.lit(t.idle_activity).alias("idle_threshold"),
            pl.lit(t.efficient_activity).alias("efficient_threshold"),
        )
        return out.select(TABLE_SCHEMAS["job_attempts"].names())

    def _count_sequence(self, telem: pl.DataFrame) -> None:
        self.counters.duplicate_samples += int(telem["duplicates"].sum())
        for agent, lo, hi, n in sequence_gaps(telem).iter_rows():
            last = self._seq_last.get(agent)
            gap = hi - lo + 1 - n
            if last is not None and lo > last + 1:
                gap += lo - last - 1
            self.counters.telemetry_lost_samples += max(gap, 0)
            self._seq_last[agent] = max(hi, last if last is not None else hi)

    # -- buffering and writing -------------------------------------------------------

    def _buffer(self, table: str, frame: pl.DataFrame) -> None:
        if frame.is_empty():
            return
        self._buffer_by_hour(table, frame, "minute")

    def _buffer_by_hour(self, table: str, frame: pl.DataFrame, time_col: str) -> None:
        if frame.is_empty():
            return
        frame = self._shape(table, frame)
        for listener in self.listeners:
            listener.facts(table, frame)
        first, last = frame.select(
            pl.col(time_col).min().dt.truncate("1h").alias("first"),
            pl.col(time_col).max().dt.truncate("1h").alias("last"),
        ).row(0)
        if first == last:  # the common case: a close step never crosses an hour
            self.hour_parts.setdefault((table, first), []).append(frame)
            return
        for (hour,), part in frame.group_by(pl.col(time_col).dt.truncate("1h").alias("_h")):
            assert isinstance(hour, datetime)
            self.hour_parts.setdefault((table, hour), []).append(part)

    @staticmethod
    def _shape(table: str, frame: pl.DataFrame) -> pl.DataFrame:
        schema = TABLE_SCHEMAS[table]
        return frame.select(schema.names()).cast(dict(schema))  # type: ignore[arg-type]

    def _write_hours(self, final: bool) -> None:
        assert self.closed_until is not None or not self.hour_parts
        done = sorted(
            {hour for (_, hour) in self.hour_parts
             if final or (self.closed_until is not None
                          and hour + timedelta(hours=1) <= self.closed_until)}
        )
        for hour in done:
            self._write_hour(hour)

    def _write_hour(self, hour: datetime) -> None:
        """Write the buffered parts of ``hour`` (partial ones stay buffered)."""
        complete = self.closed_until is not None and hour + timedelta(hours=1) <= self.closed_until
        gm = self.hour_parts.get(("gpu_minute", hour))
        if gm:
            self._write_rollups(hour, pl.concat(gm), complete)
        for table in HOURLY_TABLES:
            parts = self.hour_parts.get((table, hour))
            if not parts:
                continue
            frame = pl.concat(parts, how="vertical_relaxed")
            merge = table in MERGED_TABLES
            self.warehouse.write_part(table, hour, frame, SORT_KEYS[table], merge=merge)
            self.counters.add_rows(table, frame.height)
            if complete or merge:
                del self.hour_parts[(table, hour)]
            else:
                self.hour_parts[(table, hour)] = [frame]

    def _write_rollups(self, hour: datetime, minutes: pl.DataFrame, complete: bool) -> None:
        hourly = self._shape("gpu_hourly", rollup.hourly(minutes))
        self.warehouse.write_part("gpu_hourly", hour, hourly, SORT_KEYS["gpu_hourly"])
        day = hour.replace(hour=0)
        kept = self.day_hourly.setdefault(day, {})
        kept[hour] = hourly
        daily = self._shape("gpu_daily", rollup.daily(pl.concat(list(kept.values()))))
        self.warehouse.write_part("gpu_daily", day, daily, SORT_KEYS["gpu_daily"], hourly=False)
        day_done = self.closed_until is not None and day + timedelta(days=1) <= self.closed_until
        if complete and day_done:
            del self.day_hourly[day]

    def _write_late(self) -> None:
        for hour, parts in sorted(self.late_parts.items()):
            frame = pl.concat(parts, how="vertical_relaxed").with_columns(
                pl.col("minute").dt.date().alias("date"))
            self.warehouse.write_part("late_telemetry", hour, frame,
                                      SORT_KEYS["late_telemetry"], merge=True)
        self.late_parts.clear()

    def _write_snapshots(self) -> None:
        running = self.jobs.running_attempts()
        keys = ["job_id", "attempt"]
        acc = self.acc
        if self.shard is not None and self.shard.exchanges:
            if not self.shard.owner:  # the owner writes the snapshots, with our part
                self.outbox.append(self._parts(running, self.acc, "running"))
                return
            acc = pl.concat([acc, *[p.select(ACC_SCHEMA.names())
                                    for p in self.running_parts.values()]])
        usage = job_usage.card_mismatch(
            job_usage.attempt_usage(acc, self.config), self.config)
        snap = running.join(usage, on=keys, how="left").with_columns(
            (pl.col("mem_peak_mib") / pl.col("gpu_mem_mib")).alias("mem_peak_of_requested"))
        self.warehouse.write_snapshot("running_attempts", self._shape("running_attempts", snap),
                                      keys)
        cands = recommendations.candidates(running, self.last_free_blocks, LOW_PRIORITY)
        self.warehouse.write_snapshot("candidates", self._shape("candidates", cands),
                                      [*keys, "kind"])
