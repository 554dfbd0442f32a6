"""``gpuledger process --kafka``: the processor as a long-lived Kafka service.

- Telemetry is consumed in a consumer group (partitions by node); scheduler events and
  inventory are read in full, from the start, by every instance (global tables).
- Each loop drains the global topics first, then polls telemetry, decodes the poll
  batch per topic in one columnar pass, sends bad records to the dead-letter topic
  (with the reason and the original topic, partition and offset in headers and the raw
  record as value) and feeds the rest to the processor.
- The watermark is capped by the oldest of the newest event times of the telemetry
  partitions that still have unread data, so one partition read ahead of the others
  cannot make their samples late.
- Every ``checkpoint_interval_s`` the processor's state and the offsets it covers are
  saved together (``checkpoint.py``), then the group offsets are committed: offsets are
  committed only after what they cover is durable, and a restart resumes exactly there.
- SIGTERM/SIGINT: finish the batch, write partial hours, checkpoint, commit, exit 0.
"""

from __future__ import annotations

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
from gpuledger.pipeline.kafka.client import open_consumer, open_producer
from gpuledger.pipeline.kafka.settings import KafkaSettings
from gpuledger.pipeline.kafka.wire import DecodedBatch, Message, decode
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.warehouse import Warehouse

log = logging.getLogger("gpuledger.kafka.service")

HOLD = datetime(1970, 1, 1, tzinfo=UTC)
"""A time limit that closes nothing (the Unix epoch: older than any event)."""


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
    started: float = field(default_factory=time.monotonic)


def _messages(records: dict[Any, list[Any]]) -> dict[str, list[Message]]:
    by_topic: dict[str, list[Message]] = {}
    for tp, recs in records.items():
        by_topic.setdefault(tp.topic, []).extend(
            Message(r.topic, r.partition, r.offset, r.key, r.value,
                    tuple((k, v) for k, v in (r.headers or [])))
            for r in recs
        )
    return by_topic


class KafkaProcessorService:
    """Runs a :class:`Processor` on Kafka input with checkpointed offsets."""

    def __init__(self, settings: KafkaSettings, config: ProcessorConfig, warehouse: Path,
                 options: ServiceOptions | None = None,
                 now: Callable[[], datetime] | None = None) -> None:
        from kafka import TopicPartition

        self.settings = settings
        self.options = options or ServiceOptions()
        self.warehouse = Warehouse(warehouse)
        self.processor = Processor(config, self.warehouse, now=now, telemetry_clock=True)
        self.state_path = warehouse / "state" / f"{self.options.group_id}.checkpoint"
        self.offsets: checkpoint.Offsets = checkpoint.load(self.processor, self.state_path) or {}
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
        self.telemetry.subscribe([t.telemetry], listener=_rebalance_listener(self))
        self.globals = open_consumer(settings, enable_auto_commit=False,
                                     auto_offset_reset="earliest",
                                     max_poll_records=self.options.max_records)
        parts = [TopicPartition(topic, p) for topic in (t.jobs, t.inventory)
                 for p in sorted(self.globals.partitions_for_topic(topic) or [])]
        self.globals.assign(parts)
        for tp in parts:
            if (tp.topic, tp.partition) in self.offsets:
                self.globals.seek(tp, self.offsets[(tp.topic, tp.partition)])
            else:
                self.globals.seek_to_beginning(tp)
        self.dead = open_producer(settings)
        self.partition_time: dict[tuple[str, int], datetime] = {}
        self._ends: dict[tuple[str, int], int] = {}
        self._ends_at = 0.0
        self._last_checkpoint = time.monotonic()
        self._last_log = time.monotonic()
        self.warehouse.publish_catalog()

    # -- the loop ------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: object) -> None:
            log.info("signal %d: finishing the batch, then stopping", signum)
            self.stop.set()
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def run(self) -> None:
        idle_since: float | None = None
        while not self.stop.is_set():
            got = self._drain_globals()
            records = self.telemetry.poll(timeout_ms=self.options.poll_timeout_ms,
                                          max_records=self.options.max_records)
            got += self._handle(_messages(records), telemetry=True)
            if got or not self._caught_up():
                idle_since = None
            else:
                idle_since = idle_since or time.monotonic()
                limit = self.options.exit_when_idle_s
                if limit is not None and time.monotonic() - idle_since >= limit:
                    log.info("no input for %.0f s: flushing and exiting", limit)
                    self.processor.flush()
                    self._checkpoint()
                    return
            if time.monotonic() - self._last_checkpoint >= self.options.checkpoint_interval_s:
                self._checkpoint()
            self._log_progress()
        self.processor.write_partial()
        self._checkpoint()

    def _caught_up(self) -> bool:
        """Telemetry partitions assigned and every one read to its end."""
        assignment = list(self.telemetry.assignment())
        if not assignment:
            return False
        ends = self.telemetry.end_offsets(assignment)
        return all(self.offsets.get((tp.topic, tp.partition), 0) >= end
                   for tp, end in ends.items())

    def close(self) -> None:
        self.closing = True  # the final checkpoint is written; revocation needs none
        for client in (self.telemetry, self.globals):
            client.close(autocommit=False)
        self.dead.flush()
        self.dead.close()

    def _drain_globals(self) -> int:
        total = 0
        for _ in range(1000):
            records = self.globals.poll(timeout_ms=0 if total else 50,
                                        max_records=self.options.max_records)
            n = self._handle(_messages(records), telemetry=False)
            total += n
            if n == 0:
                break
        return total

    def _handle(self, by_topic: dict[str, list[Message]], telemetry: bool) -> int:
        if not by_topic:
            return 0
        frames: dict[str, pl.DataFrame] = {}
        count = 0
        now = datetime.now(UTC)
        for topic, msgs in by_topic.items():
            record_type = self.settings.topics.record_type_of(topic)
            if record_type is None:
                continue
            decoded = decode(msgs, record_type,  # type: ignore[arg-type]
                             now=now, max_future_s=self.processor.config.windows.max_future_s)
            self._dead_letters(decoded)
            frame = decoded.frames[record_type]  # type: ignore[index]
            if frame.height:
                frames[record_type] = frame
                self._track_partition_times(msgs, frame)
            for m in msgs:
                key = (m.topic, m.partition)
                self.offsets[key] = max(self.offsets.get(key, 0), m.offset + 1)
            count += len(msgs)
        self.stats.messages += count
        if frames:
            self.processor.process(frames, validated=True, event_time_limit=self._time_limit())
        return count

    def _track_partition_times(self, msgs: list[Message], frame: pl.DataFrame) -> None:
        """Newest event time per partition, through the message keys (node or job)."""
        column = "job_id" if frame.columns.count("event") else "node"
        partition_of: dict[str, tuple[str, int]] = {}
        for m in msgs:
            if m.key is not None:
                partition_of[m.key.decode("utf-8", "replace")] = (m.topic, m.partition)
        newest = frame.group_by(column).agg(pl.col("time").max())
        unkeyed = {(m.topic, m.partition) for m in msgs if m.key is None}
        if unkeyed:  # no key to go by: the batch's newest time stands for them
            newest_all = frame.select(pl.col("time").max()).item()
            for loose in unkeyed - set(self.partition_time):
                self.partition_time[loose] = newest_all
        for key, when in newest.iter_rows():
            found = partition_of.get(str(key))
            if found is None:
                continue
            old = self.partition_time.get(found)
            if old is None or when > old:
                self.partition_time[found] = when

    def _time_limit(self) -> datetime | None:
        """Oldest newest-time among input partitions that still have unread data.

        Telemetry partitions of this instance and every scheduler/inventory partition
        count: minutes must not close while scheduler events for them may still be
        unread. A partition with unread data whose time is not known yet holds the
        watermark where it is; a partition read to its end holds nothing.
        """
        tele = list(self.telemetry.assignment())
        glob = list(self.globals.assignment())
        if not tele:
            return None
        if time.monotonic() - self._ends_at > 1.0:
            ends = {**self.telemetry.end_offsets(tele), **self.globals.end_offsets(glob)}
            self._ends = {(tp.topic, tp.partition): off for tp, off in ends.items()}
            self._ends_at = time.monotonic()
        behind: list[datetime] = []
        for tp in (*tele, *glob):
            key = (tp.topic, tp.partition)
            if self.offsets.get(key, 0) >= self._ends.get(key, 0):
                continue
            seen = self.partition_time.get(key)
            if seen is None:
                return self.processor.closed_until or HOLD
            behind.append(seen)
        return min(behind) if behind else None

    def _dead_letters(self, decoded: DecodedBatch) -> None:
        dead = decoded.dead_letters
        if dead.is_empty():
            return
        self.stats.dead_letters += dead.height
        self.processor.add_rejects(dead.drop("topic", "partition", "offset"))
        topic = self.settings.topics.dead_letters
        for row in dead.iter_rows(named=True):
            headers = [("reason", str(row["reason"]).encode()),
                       ("source-topic", str(row["topic"] or "").encode()),
                       ("source-partition", str(row["partition"]).encode()),
                       ("source-offset", str(row["offset"]).encode())]
            self.dead.send(topic, value=str(row["raw"] or "").encode(), headers=headers)
        log.warning("%d bad record(s) sent to %s (first: %s)", dead.height, topic,
                    dead["reason"][0])

    def _checkpoint(self) -> None:
        from kafka.structs import OffsetAndMetadata

        self.dead.flush()
        checkpoint.save(self.processor, self.offsets, self.state_path)
        mine = {self._tp(t, p): OffsetAndMetadata(o, "", -1)
                for (t, p), o in self.offsets.items()
                if t == self.settings.topics.telemetry}
        owned = set(self.telemetry.assignment())
        mine = {tp: om for tp, om in mine.items() if tp in owned}
        if mine:
            self.telemetry.commit(mine)
        self.stats.checkpoints += 1
        self._last_checkpoint = time.monotonic()

    def _log_progress(self) -> None:
        if time.monotonic() - self._last_log < self.options.log_interval_s:
            return
        self._last_log = time.monotonic()
        lag = 0
        for tp in self.telemetry.assignment():
            high = self.telemetry.highwater(tp)
            if high is not None:
                lag += max(high - self.offsets.get((tp.topic, tp.partition), 0), 0)
        elapsed = time.monotonic() - self.stats.started
        c = self.processor.counters
        log.info("messages=%d (%.0f/s) samples=%d lag=%d closed_until=%s dead_letters=%d "
                 "late=%d", self.stats.messages, self.stats.messages / max(elapsed, 1e-9),
                 c.records_in["telemetry"], lag, self.processor.closed_until,
                 self.stats.dead_letters, c.late_telemetry)


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
    """Seek newly assigned partitions to the checkpoint; checkpoint before losing some."""

    def __init__(self, service: KafkaProcessorService) -> None:
        self.service = service

    def on_partitions_revoked(self, revoked: Any) -> None:
        if revoked and not self.service.closing \
                and self.service.processor.closed_until is not None:
            self.service._checkpoint()

    def on_partitions_assigned(self, assigned: Any) -> None:
        for tp in assigned:
            offset = self.service.offsets.get((tp.topic, tp.partition))
            if offset is not None:
                self.service.telemetry.seek(tp, offset)
