"""``gpuledger process --kafka``: the processor as a long-lived Kafka service.

- Telemetry is consumed in a consumer group (partitions by node). Each telemetry
  partition this instance is assigned gets a *shard* of its own (``shard.py``): a
  processor with its own state, checkpoint and fact files, which writes the facts of the
  partition's nodes. Which instance runs a shard does not change what it writes, so one
  instance or several, and any rebalance in between, give the same facts.
- Scheduler events and inventory are read in full, from the start, by every shard
  (global tables); the owner shard (partition 0) writes the cluster-wide facts and
  reads the other shards' parts of ended job attempts from the attempt-parts topic.
- Each loop drains the global topics first, then polls telemetry, decodes the poll
  batch per shard and topic in one columnar pass, sends bad records to the dead-letter
  topic (with the reason and the original topic, partition and offset in headers and
  the raw record as value) and feeds the rest to the shard's processor.
- A shard's watermark is capped by its input partitions that still have unread data,
  each at the oldest event time of the last message read from it, so one partition
  read ahead of the others, or nodes not read yet, cannot make samples late.
- Every ``checkpoint_interval_s`` each shard's state and the offsets it covers are saved
  together (``checkpoint.py``) after what it sent (dead letters, attempt parts) is
  acknowledged; then the group offsets are committed: offsets are committed only after
  what they cover is durable, and a restart resumes exactly there.
- A revoked partition's shard is checkpointed and dropped; an assigned one is loaded
  from its checkpoint (the warehouse folder, with ``state/``, is shared storage).
- SIGTERM/SIGINT: finish the batch, write partial hours, checkpoint, commit, exit 0.
"""

from __future__ import annotations

import io
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from gpuledger.pipeline import checkpoint
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.counters import Counters
from gpuledger.pipeline.kafka.client import open_consumer, open_producer
from gpuledger.pipeline.kafka.settings import KafkaSettings
from gpuledger.pipeline.kafka.wire import DecodedBatch, Message, decode
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.shard import Shard
from gpuledger.pipeline.tables import TABLE_SCHEMAS
from gpuledger.pipeline.warehouse import Warehouse

log = logging.getLogger("gpuledger.kafka.service")

HOLD = datetime(1970, 1, 1, tzinfo=UTC)
"""A time limit that closes nothing (the Unix epoch: older than any event)."""

Key = tuple[str, int]


@dataclass
class ServiceOptions:
    group_id: str = "gpuledger-processor"
    max_records: int = 20_000
    poll_timeout_ms: int = 500
    checkpoint_interval_s: float = 10.0
    exit_when_idle_s: float | None = None
    """Flush everything and exit once caught up with all input and idle this long."""
    instance_id: str | None = None
    """Static group membership: a restarted instance takes its partitions back at once."""
    session_timeout_ms: int = 10_000
    log_interval_s: float = 10.0


@dataclass
class ServiceStats:
    messages: int = 0
    dead_letters: int = 0
    checkpoints: int = 0
    parts_sent: int = 0
    started: float = field(default_factory=time.monotonic)


@dataclass
class ShardRun:
    """One assigned telemetry partition: its processor and the offsets it covers."""

    shard: Shard
    processor: Processor
    offsets: checkpoint.Offsets
    state_path: Path
    partition_time: dict[Key, datetime] = field(default_factory=dict)


def _messages(records: dict[Any, list[Any]]) -> dict[str, list[Message]]:
    by_topic: dict[str, list[Message]] = {}
    for tp, recs in records.items():
        by_topic.setdefault(tp.topic, []).extend(
            Message(r.topic, r.partition, r.offset, r.key, r.value,
                    tuple((k, v) for k, v in (r.headers or [])))
            for r in recs
        )
    return by_topic


def _last_message_times(msgs: list[Message], frame: pl.DataFrame) -> dict[Key, datetime]:
    """Per partition, the oldest event time of the last message read from it (through
    its key, node or job: the rows of that key in this batch, which may hold more of
    its messages and then make the time older, never newer).

    Messages after it, unread yet, were produced after it: the oldest time of the last
    one read bounds what is still to come better than the newest time read, since a
    message spanning minutes comes after others of the same minutes (a replay) and a
    node read for the first time has no time of its own yet."""
    column = "job_id" if "event" in frame.columns else "node"
    last: dict[Key, Message] = {}
    for m in msgs:
        key = (m.topic, m.partition)
        if key not in last or m.offset > last[key].offset:
            last[key] = m
    names = {k: m.key.decode("utf-8", "replace") for k, m in last.items()
             if m.key is not None}
    oldest = dict(frame.filter(pl.col(column).is_in(list(set(names.values()))))
                  .group_by(column).agg(pl.col("time").min()).iter_rows())
    times: dict[Key, datetime] = {}
    batch_oldest: datetime | None = None
    for key in last:
        when = oldest.get(names.get(key))
        if when is None:  # unkeyed, or its record was rejected: the batch's oldest
            if batch_oldest is None:
                batch_oldest = frame.select(pl.col("time").min()).item()
            when = batch_oldest
        times[key] = when
    return times


def encode_parts(frame: pl.DataFrame) -> bytes:
    sink = io.BytesIO()
    frame.write_ipc_stream(sink, compression="zstd")
    return sink.getvalue()


class KafkaProcessorService:
    """Runs one :class:`Processor` shard per assigned telemetry partition."""

    def __init__(self, settings: KafkaSettings, config: ProcessorConfig, warehouse: Path,
                 options: ServiceOptions | None = None,
                 now: Callable[[], datetime] | None = None) -> None:
        from kafka import TopicPartition

        self.settings = settings
        self.config = config
        self.options = options or ServiceOptions()
        self.root = warehouse
        self.now = now
        self.state_dir = warehouse / "state" / self.options.group_id
        self.stats = ServiceStats()
        self.stop = threading.Event()
        self.closing = False
        self._tp = TopicPartition
        t = settings.topics
        self.telemetry = open_consumer(
            settings, group_id=self.options.group_id, enable_auto_commit=False,
            group_instance_id=self.options.instance_id,
            session_timeout_ms=self.options.session_timeout_ms,
            auto_offset_reset="earliest", max_poll_records=self.options.max_records,
            fetch_max_bytes=64 << 20, max_partition_fetch_bytes=16 << 20,
        )
        self.globals = open_consumer(settings, enable_auto_commit=False,
                                     auto_offset_reset="earliest",
                                     max_poll_records=self.options.max_records,
                                     fetch_max_bytes=64 << 20,
                                     max_partition_fetch_bytes=16 << 20)
        self.partitions = len(self.globals.partitions_for_topic(t.telemetry) or ())
        if self.partitions == 0:
            raise RuntimeError(f"topic {t.telemetry} does not exist: run "
                               "`gpuledger topics create` first")
        self.global_parts = [TopicPartition(topic, p)
                             for topic in (t.jobs, t.inventory, t.attempt_parts)
                             for p in sorted(self.globals.partitions_for_topic(topic) or [])]
        self.globals.assign(self.global_parts)
        self.shards: dict[int, ShardRun] = {}
        self.on_shard_added: list[Callable[[Processor], None]] = []
        """Called with a shard's processor when the instance starts running it (before its
        first input): the exporter and the alert engine follow shards this way."""
        self.on_shard_dropped: list[Callable[[Processor], None]] = []
        self.producer = open_producer(settings)
        self._ends: dict[Key, int] = {}
        self._ends_at = 0.0
        self._ends_stale = True
        """Set when telemetry was read after the end offsets were fetched."""
        self._shared_times: dict[str, dict[Key, datetime]] = {}
        """Per global topic, the partition times of the batch every shard is handed."""
        self._last_checkpoint = time.monotonic()
        self._last_log = time.monotonic()
        self.telemetry.subscribe([t.telemetry], listener=_rebalance_listener(self))
        shared = Warehouse(warehouse)
        for table, schema in TABLE_SCHEMAS.items():
            shared.ensure_schema(table, schema)
        shared.publish_catalog()

    # -- shards --------------------------------------------------------------------

    def add_shard(self, partition: int) -> ShardRun:
        shard = Shard(partition, self.partitions)
        processor = Processor(self.config, Warehouse(self.root, shard.suffix), now=self.now,
                              telemetry_clock=True, shard=shard)
        path = self.state_dir / f"telemetry-{shard.suffix}.checkpoint"
        offsets = checkpoint.load(processor, path) or {}
        run = ShardRun(shard, processor, offsets, path)
        self.shards[partition] = run
        for call in self.on_shard_added:
            call(processor)
        log.info("shard %s: partition %d of %s, %s", shard.suffix, partition,
                 self.settings.topics.telemetry,
                 "from its checkpoint" if offsets else "from the start")
        self._seek_globals()
        return run

    def drop_shard(self, partition: int) -> None:
        """Checkpoint a revoked partition's shard and let it go. (No group commit: this
        runs inside the consumer's rebalance, where it cannot block; the next owner
        resumes from the checkpoint, which holds the offsets, and commits them.)"""
        run = self.shards.pop(partition, None)
        if run is None:
            return
        if run.processor.closed_until is not None or run.offsets:
            self._checkpoint_shard(run)
        for call in self.on_shard_dropped:
            call(run.processor)

    def _seek_globals(self) -> None:
        """Position the global consumer at the oldest offset any shard still needs."""
        for tp in self.global_parts:
            key = (tp.topic, tp.partition)
            needed = [run.offsets.get(key) for run in self.shards.values()]
            if any(n is None for n in needed) or not needed:
                self.globals.seek_to_beginning(tp)
            else:
                self.globals.seek(tp, min(n for n in needed if n is not None))

    @property
    def processor(self) -> Processor:
        """The owner shard's processor if it runs here, else the first one."""
        if 0 in self.shards:
            return self.shards[0].processor
        if self.shards:
            return self.shards[min(self.shards)].processor
        raise RuntimeError("no telemetry partition assigned to this instance")

    def counters(self) -> Counters:
        """The counters of every shard here, added up."""
        return Counters.total([run.processor.counters for run in self.shards.values()])

    # -- the loop ------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: object) -> None:
            log.info("signal %d: finishing the batch, then stopping", signum)
            self.stop.set()
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def run(self) -> None:
        idle_since: float | None = None
        flushed = False
        while not self.stop.is_set():
            got = self._drain_globals()
            records = self.telemetry.poll(timeout_ms=self.options.poll_timeout_ms,
                                          max_records=self.options.max_records)
            if records:
                self._ends_stale = True  # the global ends must be as new as this poll
            by_partition: dict[int, dict[Any, list[Any]]] = {}
            for tp, recs in records.items():
                by_partition.setdefault(tp.partition, {})[tp] = recs
            for partition, part_records in by_partition.items():
                run = self.shards.get(partition)
                if run is not None:
                    got += self._handle(run, _messages(part_records), telemetry=True)
            self._close_pending()
            if got or not self._caught_up():
                idle_since = None
            else:
                idle_since = idle_since or time.monotonic()
                limit = self.options.exit_when_idle_s
                if limit is not None and time.monotonic() - idle_since >= limit:
                    if not flushed:
                        log.info("no input for %.0f s: flushing", limit)
                        for run in self.shards.values():
                            run.processor.flush()
                            self._send_parts(run)
                        self._checkpoint()
                        flushed = True
                    if self._others_done(time.monotonic() - idle_since, limit):
                        for run in self.shards.values():
                            run.processor.flush()
                        self._checkpoint()
                        log.info("all input processed: exiting (%d telemetry "
                                 "message(s) read here)", self.stats.messages)
                        return
            if time.monotonic() - self._last_checkpoint >= self.options.checkpoint_interval_s:
                self._checkpoint()
            self._log_progress()
        for run in self.shards.values():
            run.processor.write_partial()
            self._send_parts(run)
        self._checkpoint()

    def _caught_up(self) -> bool:
        """Telemetry partitions assigned and every input read to its end."""
        if not self.shards:
            return False
        self._refresh_ends(force=True)
        for run in self.shards.values():
            tele = (self.settings.topics.telemetry, run.shard.partition)
            for key in (tele, *((tp.topic, tp.partition) for tp in self.global_parts)):
                if run.offsets.get(key, 0) < self._ends.get(key, 0):
                    return False
        return True

    def _others_done(self, idle_s: float, limit: float) -> bool:
        """Batch exit: the owner waits for the other shards' last attempt parts.

        They are in once every other shard has sent its end-of-input marker (after its
        last parts), every telemetry partition's committed group offset is at its end and
        the parts topic is read to its end here; after ten idle periods the owner exits
        anyway (its checkpoint keeps what waits, a later run finishes it)."""
        owner = self.shards.get(0)
        if owner is None or self.partitions == 1:
            return True
        if idle_s >= 10 * limit:
            log.warning("%d attempt(s) still wait for other shards' parts; exiting with "
                        "them in the checkpoint", owner.processor.waiting.height)
            return True
        if not self._group_at_end():
            return False
        self._refresh_ends(force=True)
        parts = [(tp.topic, tp.partition) for tp in self.global_parts
                 if tp.topic == self.settings.topics.attempt_parts]
        if any(owner.offsets.get(k, 0) < self._ends.get(k, 0) for k in parts):
            return False  # parts sent before those commits are not read yet
        others = set(range(1, self.partitions))
        if not others <= owner.processor.flushed_shards:
            return False  # a shard has not flushed (sent its last running parts) yet
        return owner.processor.waiting.is_empty()

    def _group_at_end(self) -> bool:
        from kafka.admin import KafkaAdminClient

        topic = self.settings.topics.telemetry
        admin = KafkaAdminClient(**self.settings.client_config())
        try:
            group = self.options.group_id
            committed = admin.list_group_offsets({group: None}).get(group, {})
        finally:
            admin.close()
        tps = [self._tp(topic, p) for p in range(self.partitions)]
        ends = self.globals.end_offsets(tps)
        return all(tp in committed and committed[tp].offset >= ends[tp] for tp in tps)

    def close(self) -> None:
        self.closing = True  # the final checkpoint is written; revocation needs none
        for client in (self.telemetry, self.globals):
            client.close(autocommit=False)
        self.producer.flush()
        self.producer.close()

    def _drain_globals(self) -> int:
        """Read what the global topics hold now (up to ``max_records`` messages), decode
        it once and hand it to every shard in one batch: a shard's batch has a fixed
        cost, and a topic read in many small fetches would pay it for each."""
        if not self.shards:
            return 0
        by_topic: dict[str, list[Message]] = {}
        total = 0
        self._refresh_ends()
        read = {(tp.topic, tp.partition): min(run.offsets.get((tp.topic, tp.partition), 0)
                                              for run in self.shards.values())
                for tp in self.global_parts}
        while total < self.options.max_records:
            # wait for the next fetch while the global topics hold more (a fetch may
            # bring only part of what is there)
            unread = any(at < self._ends.get(key, 0) for key, at in read.items())
            records = self.globals.poll(timeout_ms=50 if unread or not total else 0,
                                        max_records=self.options.max_records - total)
            fetched = _messages(records)
            n = sum(len(v) for v in fetched.values())
            if n == 0:
                break
            for topic, msgs in fetched.items():
                by_topic.setdefault(topic, []).extend(msgs)
                for m in msgs:
                    key = (m.topic, m.partition)
                    read[key] = max(read.get(key, 0), m.offset + 1)
            total += n
        if total == 0:
            return 0
        shared = {topic: self._decode(topic, msgs) for topic, msgs in by_topic.items()
                  if topic != self.settings.topics.attempt_parts}
        self._shared_times.clear()
        for run in list(self.shards.values()):
            self._handle(run, by_topic, telemetry=False, shared=shared)
        self._shared_times.clear()
        return total

    def _decode(self, topic: str, msgs: list[Message]) -> DecodedBatch | None:
        record_type = self.settings.topics.record_type_of(topic)
        if record_type is None:
            return None
        return decode(msgs, record_type,  # type: ignore[arg-type]
                      now=datetime.now(UTC), max_future_s=self.config.windows.max_future_s)

    def _handle(self, run: ShardRun, by_topic: dict[str, list[Message]], telemetry: bool,
                shared: dict[str, DecodedBatch | None] | None = None) -> int:
        """Feed one shard the messages it has not seen yet (by its own offsets).
        ``shared``: the global topics' messages decoded once for every shard that needs
        all of them (the usual case: shards read the global topics in step)."""
        frames: dict[str, pl.DataFrame] = {}
        count = 0
        topics = self.settings.topics
        for topic, all_msgs in by_topic.items():
            msgs = all_msgs if telemetry else [
                m for m in all_msgs if m.offset >= run.offsets.get((m.topic, m.partition), 0)]
            if not msgs:
                continue
            if topic == topics.attempt_parts:
                if run.shard.owner:
                    for m in msgs:
                        run.processor.receive_parts(pl.read_ipc_stream(io.BytesIO(m.value)))
            else:
                record_type = topics.record_type_of(topic)
                if record_type is None:
                    continue
                whole = shared is not None and len(msgs) == len(all_msgs)
                decoded = shared.get(topic) if shared is not None and whole else \
                    self._decode(topic, msgs)
                if decoded is None:
                    continue
                # a bad global record is every shard's; the owner reports it
                if telemetry or run.shard.owner:
                    self._dead_letters(run, decoded)
                frame = decoded.frames[record_type]  # type: ignore[index]
                if frame.height:
                    frames[record_type] = frame
                    times = self._shared_times.get(topic) if whole else None
                    if times is None:
                        times = _last_message_times(msgs, frame)
                        if whole:  # the same for every shard reading in step
                            self._shared_times[topic] = times
                    run.partition_time.update(times)
            for m in msgs:
                key = (m.topic, m.partition)
                run.offsets[key] = max(run.offsets.get(key, 0), m.offset + 1)
            count += len(msgs)
        if telemetry:
            self.stats.messages += count
        if frames:
            limit, behind = self._time_limit(run)
            run.processor.process(frames, validated=True, event_time_limit=limit,
                                  behind=behind)
        self._send_parts(run)
        return count

    def _send_parts(self, run: ShardRun) -> None:
        """Send the shard's attempt parts to the owner (acknowledged before checkpoints)."""
        outbox = run.processor.outbox
        if not outbox:
            return
        key = run.shard.suffix.encode()
        for frame in outbox:
            self.producer.send(self.settings.topics.attempt_parts, key=key,
                               value=encode_parts(frame))
            self.stats.parts_sent += 1
        outbox.clear()

    def _refresh_ends(self, force: bool = False) -> None:
        """End offsets of the shards' inputs. They are fetched again after every
        telemetry poll that returned records: a scheduler event produced before the
        telemetry just read is then known to be unread, and holds the watermark."""
        if not force and not self._ends_stale and time.monotonic() - self._ends_at <= 1.0:
            return
        tele = [self._tp(self.settings.topics.telemetry, p) for p in self.shards]
        ends = {**self.globals.end_offsets(tele), **self.globals.end_offsets(self.global_parts)}
        self._ends = {(tp.topic, tp.partition): off for tp, off in ends.items()}
        self._ends_at = time.monotonic()
        self._ends_stale = False

    def _time_limit(self, run: ShardRun) -> tuple[datetime | None, bool]:
        """Oldest time among the shard's input partitions with unread data (each one's
        by :func:`_last_message_times`), and whether any has unread data (the shard is
        *behind*; ``Processor.advance`` decides whether it is catching up).

        Its telemetry partition and every scheduler/inventory partition count: minutes
        must not close while scheduler events for them may still be unread. A partition
        with unread data whose time is not known yet holds the watermark where it is; a
        partition read to its end holds nothing.
        """
        self._refresh_ends()
        topics = self.settings.topics
        keys = [(topics.telemetry, run.shard.partition),
                *((tp.topic, tp.partition) for tp in self.global_parts
                  if tp.topic != topics.attempt_parts)]
        behind: list[datetime] = []
        for key in keys:
            if run.offsets.get(key, 0) >= self._ends.get(key, 0):
                continue
            seen = run.partition_time.get(key)
            if seen is None:
                return run.processor.closed_until or HOLD, True
            behind.append(seen)
        return (min(behind) if behind else None), bool(behind)

    def _close_pending(self) -> None:
        """Close what shards held back while behind, once they have nothing to read."""
        for run in self.shards.values():
            if run.processor.close_pending:
                limit, behind = self._time_limit(run)
                run.processor.advance(limit, behind)
                self._send_parts(run)

    def _dead_letters(self, run: ShardRun, decoded: DecodedBatch) -> None:
        dead = decoded.dead_letters
        if dead.is_empty():
            return
        self.stats.dead_letters += dead.height
        run.processor.add_rejects(dead.drop("topic", "partition", "offset"))
        topic = self.settings.topics.dead_letters
        for row in dead.iter_rows(named=True):
            headers = [("reason", str(row["reason"]).encode()),
                       ("source-topic", str(row["topic"] or "").encode()),
                       ("source-partition", str(row["partition"]).encode()),
                       ("source-offset", str(row["offset"]).encode())]
            self.producer.send(topic, value=str(row["raw"] or "").encode(), headers=headers)
        log.warning("%d bad record(s) sent to %s (first: %s)", dead.height, topic,
                    dead["reason"][0])

    def _checkpoint_shard(self, run: ShardRun) -> None:
        self._send_parts(run)
        self.producer.flush()  # dead letters and parts acknowledged before the offsets
        checkpoint.save(run.processor, run.offsets, run.state_path)

    def _commits(self, runs: list[ShardRun]) -> dict[Any, Any]:
        from kafka.structs import OffsetAndMetadata

        topic = self.settings.topics.telemetry
        out = {}
        for run in runs:
            offset = run.offsets.get((topic, run.shard.partition))
            if offset is not None:
                out[self._tp(topic, run.shard.partition)] = OffsetAndMetadata(offset, "", -1)
        return out

    def _checkpoint(self) -> None:
        runs = [run for run in self.shards.values() if run.processor.closed_until is not None
                or run.offsets]
        for run in runs:
            self._checkpoint_shard(run)
        owned = {tp.partition for tp in self.telemetry.assignment()}
        commits = self._commits([run for run in runs if run.shard.partition in owned])
        if commits:
            self.telemetry.commit(commits)
        self.stats.checkpoints += 1
        self._last_checkpoint = time.monotonic()

    def _log_progress(self) -> None:
        if time.monotonic() - self._last_log < self.options.log_interval_s:
            return
        self._last_log = time.monotonic()
        lag = 0
        for tp in self.telemetry.assignment():
            high = self.telemetry.highwater(tp)
            run = self.shards.get(tp.partition)
            if high is not None and run is not None:
                lag += max(high - run.offsets.get((tp.topic, tp.partition), 0), 0)
        elapsed = time.monotonic() - self.stats.started
        c = self.counters()
        closed = [r.processor.closed_until for r in self.shards.values()
                  if r.processor.closed_until is not None]
        log.info("shards=%s messages=%d (%.0f/s) samples=%d lag=%d closed_until=%s "
                 "dead_letters=%d late=%d", sorted(self.shards), self.stats.messages,
                 self.stats.messages / max(elapsed, 1e-9), c.records_in["telemetry"], lag,
                 min(closed) if closed else None, self.stats.dead_letters, c.late_telemetry)


def _rebalance_listener(service: KafkaProcessorService) -> Any:
    """A kafka-python rebalance listener bound to ``service``."""
    from kafka import ConsumerRebalanceListener

    class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
        def on_partitions_revoked(self, revoked: Any) -> None:
            _Rebalance(service).on_partitions_revoked(revoked)

        def on_partitions_assigned(self, assigned: Any) -> None:
            _Rebalance(service).on_partitions_assigned(assigned)

    return Listener()


class _Rebalance:
    """Checkpoint and drop revoked shards; load assigned ones and seek to their offsets."""

    def __init__(self, service: KafkaProcessorService) -> None:
        self.service = service

    def on_partitions_revoked(self, revoked: Any) -> None:
        if self.service.closing:
            return
        for tp in revoked:
            self.service.drop_shard(tp.partition)

    def on_partitions_assigned(self, assigned: Any) -> None:
        for tp in assigned:
            run = self.service.shards.get(tp.partition) or self.service.add_shard(tp.partition)
            offset = run.offsets.get((tp.topic, tp.partition))
            if offset is not None:
                self.service.telemetry.seek(tp, offset)
