"""``gpuledger process --kafka``: the processor as a long-lived Kafka service.

- Telemetry is consumed in a consumer group (partitions by node). The instance runs
  **one engine** (``processor.py``) over every telemetry partition it is assigned: one
  decode of each poll for all of them, one set of scheduler and inventory state, one
  close pass per step. The partition is a column of the engine's state and a key of its
  fact files (``partitions.py``), so one instance or several, and any rebalance in
  between, give the same facts.
- Scheduler events and inventory are read in full by every instance (global tables);
  the instance that holds partition 0 (the *owner*) writes the cluster-wide facts and
  reads the other instances' parts of ended job attempts from the attempt-parts topic.
  Inside one instance no exchange is needed.
- Each loop drains the global topics first (decoded once), then polls telemetry, decodes
  the poll in one columnar pass, sends bad records to the dead-letter topic (with the
  reason and the original topic, partition and offset in headers and the raw record as
  value) and feeds the rest to the engine.
- The watermark is capped by the input partitions that still have unread data, each at
  the oldest event time of the last message read from it, so one partition read ahead of
  the others, or nodes not read yet, cannot make samples late.
- Every ``checkpoint_interval_s`` the engine's global state (with the global topics'
  offsets) and each held partition's section (with its telemetry offset) are saved
  (``checkpoint.py``) after what the instance sent (dead letters, attempt parts) is
  acknowledged; then the group offsets are committed: offsets are committed only after
  what they cover is durable, and a restart resumes exactly there.
- A revoked partition's section is saved and its rows leave the engine; an assigned one
  is loaded from its newest section, wherever it was written (the ``state/`` folder or
  bucket prefix is shared by the group's instances: ``warehouse.state``, by default
  ``<warehouse>/state``), with the history it needs from the books.
- The group's session can expire (a long pause, a loaded machine): a commit refused
  for it (``CommitFailedError``, ``UnknownMemberId``) does not stop the service; the
  consumer rejoins, the rebalance hands partitions back from their sections, and work
  goes on from the last checkpoint.
- SIGTERM/SIGINT: finish the batch, write partial hours, checkpoint, commit, exit 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
from polars.exceptions import PanicException

from gpuledger.outage_log import OutageLog, error_text
from gpuledger.pipeline import checkpoint
from gpuledger.pipeline.arrow_ipc import read_frame
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.counters import Counters
from gpuledger.pipeline.generations import published_units
from gpuledger.pipeline.ingest import fact_hours, floor_hour
from gpuledger.pipeline.kafka import group_claim
from gpuledger.pipeline.kafka.client import (
    first_reason,
    held_back_client_lines,
    open_consumer,
    open_producer,
)
from gpuledger.pipeline.kafka.settings import KafkaSettings
from gpuledger.pipeline.kafka.wire import (
    DecodedBatch,
    Message,
    decode,
    ipc_stream,
    message_reject,
)
from gpuledger.pipeline.memory import rss_bytes, tune_allocator
from gpuledger.pipeline.partitions import Partitioning
from gpuledger.pipeline.processor import Processor, conform_parts
from gpuledger.pipeline.store import StoreConflict, open_store
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
    max_poll_samples: int = 1_000_000
    """A telemetry poll takes at most about this many samples (messages counted from the
    samples per message of the last poll; 500 messages before any): the batch, and the
    memory it needs, do not follow the backlog."""
    poll_timeout_ms: int = 500
    checkpoint_interval_s: float = 10.0
    exit_when_idle_s: float | None = None
    """Flush everything and exit once caught up with all input and idle this long."""
    instance_id: str | None = None
    """Static group membership: a restarted instance takes its partitions back at once.
    Also names the instance's checkpoint of the global state."""
    session_timeout_ms: int = 10_000
    """The group drops an instance silent this long (its partitions move elsewhere).
    Also how long any call of the loop to the broker may wait: a broker away longer is
    an outage, said as one (with the default request timeout, 305 s, and kafka-python's
    60 s wait for a topic's metadata, the service waited out whole outages in silence)."""
    heartbeat_interval_ms: int = 3_000
    max_poll_interval_ms: int = 300_000
    """The group drops an instance that does not poll for this long."""
    request_timeout_ms: int = 305_000
    log_interval_s: float = 10.0


@dataclass
class ServiceStats:
    messages: int = 0
    samples: int = 0
    """Telemetry samples this process decoded from what it read (a replay after a
    restart is read again and counted; a checkpoint's counters, its own or another
    instance's, are not)."""
    dead_letters: int = 0
    checkpoints: int = 0
    parts_sent: int = 0
    rejoins: int = 0
    """Commits refused because the group had dropped this instance (it rejoined)."""
    recoveries: int = 0
    """Times Kafka was unreachable and the service went back to its last checkpoint."""
    started: float = field(default_factory=time.monotonic)


def _messages(records: dict[Any, list[Any]]) -> dict[str, list[Message]]:
    by_topic: dict[str, list[Message]] = {}
    for tp, recs in records.items():
        by_topic.setdefault(tp.topic, []).extend(
            # a null value (a tombstone: how a compacted topic forgets a key) holds no
            # record: empty, as the confluent client hands it over
            Message(r.topic, r.partition, r.offset, r.key,
                    b"" if r.value is None else r.value,
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
    return ipc_stream(frame, "zstd")


def _transient(exc: BaseException) -> bool:
    """An error of the connection to Kafka (a broker restarting, a network cut), after
    which the service goes back to its last checkpoint and on, rather than stopping."""
    from kafka.errors import KafkaError

    if isinstance(exc, KafkaError | TimeoutError | ConnectionError):
        return True
    return type(exc).__name__ == "KafkaException"  # confluent-kafka's


def unreachable(bootstrap: str, exc: BaseException,
                held: list[str] | None = None) -> ServiceStartError | None:
    """The one-line error for ``exc`` when it says Kafka at ``bootstrap`` cannot be
    reached (None when it says something else), with the first of the client's lines
    ``held`` back meanwhile (``client.held_back_client_lines``)."""
    if not _transient(exc):
        return None
    refused = _refusal(exc)
    if refused:
        return ServiceStartError(f"{refused} ({_refusal_reason(exc)})")
    reason = first_reason(held or [])
    return ServiceStartError(f"cannot reach Kafka at {bootstrap} ({error_text(exc, 200)}"
                             f"{'; ' + reason if reason else ''})")


def _refusal(exc: BaseException) -> str | None:
    """What an error that is no connection problem says: a value the client refused
    (a timeout of 1 ms), or a request the broker answered with a refusal (a replication
    factor above the brokers it has, a partition count its policy forbids). They read
    "cannot reach Kafka", with the broker reachable."""
    from kafka.errors import AuthorizationError, BrokerResponseError, KafkaConfigurationError

    if isinstance(exc, KafkaConfigurationError):
        return "a Kafka client setting is refused"
    if (isinstance(exc, BrokerResponseError) and not exc.retriable
            and not isinstance(exc, AuthorizationError)
            and "Authentication" not in type(exc).__name__):
        return "Kafka refused the request"
    return None


def _refusal_reason(exc: BaseException) -> str:
    """A broker's refusal in one line: the error's name and the broker's own message
    (kafka-python's text is the request and response dumped whole, cut at 200 characters
    in the middle of the request: `--replication 3` on one broker said nothing of why)."""
    import re

    said = re.findall(r"error_message='((?:[^'\\]|\\.)+)'", str(exc))
    why = said[0] if said else getattr(exc, "description", None)
    if not why:
        return error_text(exc, 200)
    names = re.findall(r"CreatableTopicResult\([^)]*?name='([^']+)'[^)]*?error_code=[1-9]",
                       str(exc))
    topic = f"topic {names[0]}: " if names else ""
    return f"{type(exc).__name__}: {topic}{why}"


@contextlib.contextmanager
def kafka_reached(bootstrap: str) -> Iterator[None]:
    """A Kafka at ``bootstrap`` that cannot be reached, met in the block, is one
    :class:`ServiceStartError` line, with the first reason the client logged (its lines
    held back meanwhile: ``client.held_back_client_lines``); other errors go on as they
    are."""
    with held_back_client_lines() as held:
        try:
            yield
        except ServiceStartError:
            raise
        except Exception as exc:
            error = unreachable(bootstrap, exc, held)
            if error is None:
                raise
            raise error from None


def _rejoin_error(exc: BaseException) -> bool:
    """A commit refused because the group no longer counts this member (its session
    expired, or a rebalance is under way): the consumer rejoins by itself."""
    name = type(exc).__name__
    text = str(exc)
    return name in ("CommitFailedError", "UnknownMemberIdError", "IllegalGenerationError",
                    "RebalanceInProgressError", "FencedInstanceIdError") or any(
        s in text for s in ("UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION", "REBALANCE_IN_PROGRESS",
                            "CommitFailed", "UnknownMemberId"))


PARTITIONS_FILE = "telemetry.partitions"
"""In the group's checkpoint folder: the telemetry topic's partition count at the group's
first start."""
GLOBALS_IDLE_S = 24 * 3600.0
"""Another instance's global checkpoint not written for this long is of an instance gone
(a live one writes it every ``checkpoint_interval_s``): deleted at start."""
GROUP_CHECK_TIMEOUT_S = 30.0
"""How long reading the group's committed offsets may take (kafka-python waits forever
for an unreachable coordinator without a timeout)."""
IDLE_LOG_EVERY = 6
"""While nothing changes, the progress line comes every this many log intervals."""
STOP_GRACE_S = 60.0
"""How long a stop asked by a signal may take before the process ends without its last
checkpoint (a broker that is down holds a request for ``request_timeout_ms``)."""


class ServiceStartError(RuntimeError):
    """The service cannot start (or go on): the broker cannot be reached, the topics do
    not exist, the group is another deployment's (the message says which, in one line)."""


WRITING_MARK = "writing"
"""In a group's checkpoint folder: an instance of the group has passed the check for
other writers' facts and may have written its own (the first minute it checked, as
text). A restart of the group is then not checked again."""


def _no_telemetry_topic(settings: KafkaSettings) -> ServiceStartError:
    return ServiceStartError(f"topic {settings.topics.telemetry} does not exist on "
                             f"{settings.bootstrap}: run `gpuledger topics create` "
                             "first (or check --topic-prefix)")


def check_input_topics(settings: KafkaSettings) -> None:
    """The telemetry topic exists (:class:`ServiceStartError` otherwise, and when Kafka
    cannot be reached), asked before anything is made on the broker: a typo'd
    ``--topic-prefix`` was refused by the service after the alerts topic had been
    created under it."""
    log.info("connecting to Kafka at %s (to check the input topics)", settings.bootstrap)
    with kafka_reached(settings.bootstrap):
        consumer = open_consumer(settings, enable_auto_commit=False)
        try:
            found = consumer.partitions_for_topic(settings.topics.telemetry)
        finally:
            consumer.close()
    if not found:
        raise _no_telemetry_topic(settings)


class KafkaProcessorService:
    """Runs one :class:`Processor` engine over the telemetry partitions assigned here."""

    def __init__(self, settings: KafkaSettings, config: ProcessorConfig,
                 warehouse: str | Path, options: ServiceOptions | None = None,
                 now: Callable[[], datetime] | None = None) -> None:
        from kafka import TopicPartition

        shared = Warehouse(warehouse, options=config.warehouse)  # a bad location stops here
        tune_allocator()  # before the clients start their threads
        self.settings = settings
        self.config = config
        self.options = options or ServiceOptions()
        self.root = warehouse
        self.now = now
        self.stats = ServiceStats()
        self.stop = threading.Event()
        self.closed = threading.Event()
        """Set once :meth:`close` is done."""
        self.closing = False
        self._tp = TopicPartition
        o = self.options
        t = settings.topics
        log.info("connecting to Kafka at %s", settings.bootstrap)
        with kafka_reached(settings.bootstrap):
            self._connect(settings, o)
        self.global_parts = [TopicPartition(topic, p)
                             for topic in (t.jobs, t.inventory, t.attempt_parts)
                             for p in sorted(self.globals.partitions_for_topic(topic) or [])]
        self.globals.assign(self.global_parts)
        try:
            self._finish_init(shared, config, settings, now)
        except BaseException:   # refused at the start: the clients' threads end too
            for client in (self.telemetry, self.globals):
                with contextlib.suppress(Exception):
                    client.close(autocommit=False)
            raise

    def _connect(self, settings: KafkaSettings, o: ServiceOptions) -> None:
        """The two consumers, and the number of telemetry partitions
        (:class:`ServiceStartError` when the topics do not exist)."""
        t = settings.topics
        self.telemetry = open_consumer(
            settings, group_id=o.group_id, enable_auto_commit=False,
            group_instance_id=o.instance_id, session_timeout_ms=o.session_timeout_ms,
            heartbeat_interval_ms=o.heartbeat_interval_ms,
            max_poll_interval_ms=o.max_poll_interval_ms,
            request_timeout_ms=o.request_timeout_ms,
            auto_offset_reset="earliest", max_poll_records=o.max_records,
            fetch_max_bytes=64 << 20, max_partition_fetch_bytes=16 << 20,
        )
        self.globals = open_consumer(settings, enable_auto_commit=False,
                                     auto_offset_reset="earliest",
                                     request_timeout_ms=o.request_timeout_ms,
                                     max_poll_records=o.max_records,
                                     fetch_max_bytes=64 << 20,
                                     max_partition_fetch_bytes=16 << 20)
        self.partitions = len(self.globals.partitions_for_topic(t.telemetry) or ())
        if self.partitions == 0:
            raise _no_telemetry_topic(settings)

    def _finish_init(self, shared: Warehouse, config: ProcessorConfig,
                     settings: KafkaSettings, now: Callable[[], datetime] | None) -> None:
        o, t = self.options, settings.topics
        for table, schema in TABLE_SCHEMAS.items():
            shared.ensure_schema(table, schema)
        shared.publish_catalog(required=False)   # other instances may be writing it
        self.engine = Processor(config, shared, now=now, telemetry_clock=True,
                                partitioning=Partitioning(self.partitions, set()))
        instance = o.instance_id or f"{socket.gethostname()}-{os.getpid()}"
        state = (open_store(config.warehouse.state) if config.warehouse.state
                 else shared.store.child("state"))
        self.store = checkpoint.CheckpointStore(state.child(o.group_id), instance,
                                                incremental=True)
        self._writers_checked = self._group_has_checkpoint()
        """Whether the warehouse's facts were checked for other writers' (at the first
        telemetry read; a group resuming from its checkpoints needs no check)."""
        self._check_partition_count(shared)
        self.deployment = ""  # read (made if missing) by every check, the first just below
        self._old_claim_said = False
        self._check_group()
        self.offsets: dict[Key, int] = {}
        """The next offset to read of every input partition (telemetry held, globals)."""
        self.rebalance_failure: Exception | None = None
        """What a rebalance callback failed with (an unreadable checkpoint): kept, not
        raised inside the client (kafka-python would only log it, with a traceback), and
        raised by the loop right after the poll, before any record is handled."""
        self.unfinished: list[int] = []
        self._flushed_at: dict[int, int] = {}
        """Per telemetry partition held, its offset at this instance's last flush (a
        batch run's): its commits at that offset say it is flushed (``group_claim``)."""
        """Telemetry partitions a batch run (``--exit-when-idle``) exited without: no live
        instance had processed them to their end."""
        self._seek_globals()
        gone = self.store.prune_globals(max(GLOBALS_IDLE_S, 10 * o.checkpoint_interval_s),
                                        time.time())
        if gone:
            log.info("%d global checkpoint(s) of instances gone deleted (e.g. %s)",
                     len(gone), gone[0])
        swept = shared.store.sweep_temporary()
        if not state.url.startswith(shared.store.url.rstrip("/") + "/"):
            swept += state.sweep_temporary()
        if swept:
            log.info("%d temporary file(s) of writers killed mid-write deleted (e.g. %s)",
                     len(swept), swept[0])
        self.partition_time: dict[Key, datetime] = {}
        self.on_engine: list[Callable[[Processor], None]] = []
        """Called with the engine once (the exporter and the alert engine follow it)."""
        self.producer = open_producer(settings, max_block_ms=o.session_timeout_ms)
        self._ends: dict[Key, int] = {}
        self._ends_at = 0.0
        self._ends_stale = True
        """Set when telemetry was read after the end offsets were fetched."""
        self._last_checkpoint = time.monotonic()
        self._last_log = time.monotonic()
        self._last_logged: tuple[int, datetime | None, list[int]] | None = None
        """What the last progress line said: messages read, closed until, partitions."""
        self._samples_per_message: float | None = None
        """Of the last telemetry poll: how many messages the next one may take."""
        self.telemetry.subscribe([t.telemetry], listener=_rebalance_listener(self))

    # -- what others read ------------------------------------------------------------

    @property
    def processor(self) -> Processor:
        """The engine."""
        return self.engine

    @property
    def held(self) -> set[int]:
        """The telemetry partitions this instance holds now."""
        return self.engine.held

    def counters(self) -> Counters:
        return self.engine.counters

    def follow(self, attach: Callable[[Processor], Any]) -> None:
        """Call ``attach(engine)`` (the engine is the same for the service's whole life)."""
        attach(self.engine)

    # -- partitions ------------------------------------------------------------------

    def add_partition(self, partition: int) -> None:
        """Hold ``partition``: from its newest section (anyone's), or from the start."""
        tele = (self.settings.topics.telemetry, partition)
        sec = self.store.read_partition(partition)
        if sec is None and self.engine.pruned_to is not None:
            self._rebuild_books(partition)
            return
        if sec is None:
            self.engine.start_partition(partition, None)
            self.offsets.pop(tele, None)
            if partition == 0:
                self._seek_parts({})
            log.info("partition %d of %s: from the start", partition,
                     self.settings.topics.telemetry)
            return
        if tele in sec.offsets:
            self._check_offset(tele, sec.offsets[tele], self.store.store.url_of(
                self.store.partition_path(partition)))
        self._read_globals_to(sec.offsets)
        if self._books_short_of(partition, sec):
            self._rebuild_books(partition, sec)
            return
        checkpoint.merge_section(self.engine, sec)
        if tele in sec.offsets:
            self.offsets[tele] = sec.offsets[tele]
        else:
            self.offsets.pop(tele, None)
        if partition == 0:
            self._seek_parts(sec.offsets)
        log.info("partition %d of %s: from its checkpoint (offset %s, closed until %s)",
                 partition, self.settings.topics.telemetry, sec.offsets.get(tele),
                 sec.closed)

    def _seek_parts(self, offsets: dict[Key, int]) -> None:
        """Read the attempt-parts topic from where partition 0's section (the owner's
        state: the attempts waiting, the parts received) had read it, or from the start
        without one. An instance that takes partition 0 had skipped the parts while it
        did not own, and its global checkpoint may be another instance's, read further:
        reading on from there lost the parts sent in between (a probe: 3 instances
        killed at random, 7 of 21 attempts never written)."""
        topic = self.settings.topics.attempt_parts
        for tp in self.global_parts:
            if tp.topic != topic:
                continue
            key = (tp.topic, tp.partition)
            if key in offsets:
                self.offsets[key] = offsets[key]
                self.globals.seek(tp, offsets[key])
            else:
                self.offsets.pop(key, None)
                self.globals.seek_to_beginning(tp)
        self._ends_stale = True

    def _deployment(self) -> str:
        try:
            return group_claim.deployment_id(self.store.store)
        except ValueError as exc:
            raise ServiceStartError(str(exc)) from None

    def _check_group(self) -> None:
        """The group's telemetry commits are this deployment's, or none is another's
        from a live service (``group_claim.py``); :class:`ServiceStartError` otherwise:
        at the start, before anything is read; at a checkpoint, before this deployment's
        offsets are committed over the other's."""
        topic, now = self.settings.topics.telemetry, time.time()
        claims = []
        deadline = time.monotonic() + GROUP_CHECK_TIMEOUT_S  # a broker away: a timeout,
        for p in range(self.partitions):                     # which is transient
            left_ms = max(1, int((deadline - time.monotonic()) * 1000))
            committed = self.telemetry.committed(self._tp(topic, p), metadata=True,
                                                 timeout_ms=left_ms)
            claim = group_claim.parse(p, getattr(committed, "metadata", None), now)
            if claim is not None:
                claims.append(claim)
        # read again at every check, before this instance commits with it: two instances
        # of one deployment starting in the same instant may both write the id to a
        # bucket, each reading its own back; the last write stands, and the instance
        # whose write did not must commit with it too, or the other refuses them both
        self.deployment = self._deployment()
        foreign = group_claim.others(claims, self.deployment)
        if not foreign:
            return
        c, window = foreign[0], group_claim.window_s(self.options.checkpoint_interval_s)
        said = (f"consumer group {self.options.group_id} holds commits of another "
                f"deployment ({c.deployment}, partition {c.partition} of {topic}, "
                f"{c.age_s:.0f} s ago); this one is {self.deployment} "
                f"({self.store.store.url_of(group_claim.ID_FILE)})")
        if c.age_s <= window:
            raise ServiceStartError(
                f"{said}: two services with different warehouses share the group, which "
                "splits the partitions between them, and each warehouse would miss the "
                "other's facts. Give each deployment its own --group (if that was this "
                f"warehouse before its state was deleted, start again in {window:.0f} s)")
        if not self._old_claim_said:
            self._old_claim_said = True
            log.warning("%s, not live (none within %.0f s): this deployment's commits "
                        "replace them", said, window)

    def _group_has_checkpoint(self) -> bool:
        """Whether the group's checkpoint folder holds a checkpoint, or the mark that an
        instance of the group passed the other-writers check (:data:`WRITING_MARK`)."""
        return self.store.holds(WRITING_MARK)

    def _refuse_other_writers(self, first: datetime) -> None:
        """A group with no checkpoint yet, starting at ``first``: refuse (one
        :class:`ServiceStartError` line, before anything is written) where the warehouse
        already holds facts in the hours from ``first`` on, which another writer wrote
        (an ingest, an import, the demo, another group): the service would write every
        fact of those hours a second time beside them (an ingest then the service over
        the same records: 69,120 gpu_minute rows, 34,560 distinct, nothing said). Facts
        of earlier hours (an imported history the service goes on from) are no bar. A
        sibling instance of this group that passed the check since this one started (its
        mark is written before its first fact) counts as the group resuming."""
        self._writers_checked = True
        if self.store.store.exists(WRITING_MARK):
            return
        start = floor_hour(first)
        hours = fact_hours(self.engine.warehouse.store,
                           (start, datetime(9999, 1, 1, tzinfo=UTC)))
        if not hours:
            # said before its first fact: an instance killed before its first checkpoint
            # (its facts written) was refused its own hours when started again
            self.store.store.write(WRITING_MARK, f"{first.isoformat()}\n".encode())
            return
        raise ServiceStartError(
            f"the warehouse {self.root} already holds facts in the hours this service's "
            f"input covers (its first minute {first:%Y-%m-%d %H:%M} UTC; facts from "
            f"{hours[0]:%Y-%m-%d %H:%M} UTC on) that no run of consumer group "
            f"{self.options.group_id} wrote (an ingest, an import, the demo, another "
            "group): processing would write every fact of those hours a second time. "
            "Use a warehouse of its own (--warehouse), or the group that wrote them")

    def _check_partition_count(self, shared: Warehouse) -> None:
        """The telemetry topic has at least the partitions the group's checkpoints and
        the warehouse's facts were written for (:class:`ServiceStartError` otherwise): a
        topic created again with fewer partitions left the facts of the ones gone beside
        the new ones (counted twice), or crashed the service on a partition it no longer
        has."""
        topic, n = self.settings.topics.telemetry, self.partitions
        sections = sorted(p for p in self.store.partitions() if p >= n)
        units = sorted(u for u in published_units(shared.store)
                       if u.startswith("p") and u[1:].isdigit() and int(u[1:]) >= n)
        if sections or units:
            what = (f"checkpoints of partition(s) {', '.join(map(str, sections))} in "
                    f"{self.store.store.url}" if sections else
                    f"facts of partition(s) {', '.join(u[1:].lstrip('0') or '0' for u in units)} "
                    f"in {shared.location}")
            raise ServiceStartError(
                f"topic {topic} has {n} partition(s), and there are {what}: the topic was "
                "created again with fewer partitions. Process it into a new warehouse (and "
                "group), or recreate the topic with the partitions it had")
        self._check_partitions_added(topic, n)

    def _check_partitions_added(self, topic: str, n: int) -> None:
        """The telemetry topic has the partitions the group's checkpoints were written
        for, as recorded in :data:`PARTITIONS_FILE` at the group's first start: partitions
        added to a live topic move nodes to other partitions, whose facts of the same
        minutes were then written twice (1,350 GPU-minutes doubled and 60 % of the
        allocated GPU-hours lost in a probe, exit 0)."""
        store = self.store.store
        recorded = store.read(PARTITIONS_FILE)
        if recorded is None:
            with contextlib.suppress(StoreConflict):   # another instance, at once
                store.create(PARTITIONS_FILE, f"{n}\n".encode())
            return
        text = recorded.decode("utf-8", "replace").strip()
        if not text.isdigit():
            raise ServiceStartError(f"{store.url_of(PARTITIONS_FILE)}: not a partition "
                                    f"count ({text[:40]!r}); delete it if the topic has "
                                    "the partitions the checkpoints were written for")
        if int(text) != n:
            raise ServiceStartError(
                f"topic {topic} has {n} partition(s); this group's checkpoints were "
                f"written for {int(text)} ({store.url_of(PARTITIONS_FILE)}): partitions "
                "were added or the topic made again, which moves nodes to other "
                "partitions, and their minutes would be counted twice. Process the topic "
                "into a new warehouse and group (docs/kafka.md, Topics created again)")

    def _check_offset(self, key: Key, offset: int, where: str) -> None:
        """A checkpoint's ``offset`` of ``key`` lies within what the topic holds: past its
        end, the topic was deleted and created again (or lost data), and reading on from
        there skips the new topic's first records (a probe: an hour of telemetry)."""
        tp = self._tp(*key)
        try:
            end = self.globals.end_offsets(
                [tp], timeout_ms=self.options.session_timeout_ms).get(tp)
        except Exception as exc:  # the broker is away (a reload in an outage): not known
            if not _transient(exc):
                raise
            return
        if end is not None and offset > end:
            raise checkpoint.CheckpointError(
                f"{where}: offset {offset:,} of {key[0]} partition {key[1]} is past the "
                f"topic's end ({end:,}): the topic was deleted and created again, or lost "
                "data, since the checkpoint was written")

    def _books_short_of(self, partition: int, sec: checkpoint.Section) -> bool:
        """Whether the engine's books lack history that ``sec`` needs to close from
        where it stopped: they were pruned past that point, and read past the section's
        own books (the jobs its nodes ran then, which ended in between, are forgotten
        here and not in the section's history). Partition 0 closes the cluster-wide
        facts, which need every node's jobs: its section's history is of its own nodes,
        so any pruning past its point is short."""
        pruned = self.engine.pruned_to
        start = sec.closed or self.engine.started
        if pruned is None or start is None or start >= pruned:
            return False
        if partition == 0 and self.engine.config.cluster_facts:
            return True
        skip = (self.settings.topics.telemetry, self.settings.topics.attempt_parts)
        return any(v > sec.offsets.get(k, 0) for k, v in self.offsets.items()
                   if k[0] not in skip)

    def _rebuild_books(self, partition: int, sec: checkpoint.Section | None = None) -> None:
        """Take ``partition`` when the engine's books no longer hold the history it
        needs (before ``engine.pruned_to``): it has no checkpoint section (never
        checkpointed: its holder died first; or its file was moved aside), or its
        section closed before that point (``_books_short_of``). Closed with those books,
        its jobs' GPUs read as unaccounted or free (−6.7 % allocated GPU-minutes in a
        probe). The partitions held keep their state (saved as sections and taken
        back); the books are read again from the start of the global topics; the new
        partition then starts from its section, or where the engine started."""
        topics = self.settings.topics
        what = ("has no checkpoint section" if sec is None else
                f"is taken from a checkpoint closed until {sec.closed or self.engine.started}")
        log.warning("partition %d of %s %s, and this instance's books hold no history "
                    "before %s: reading the global topics again from their start to "
                    "rebuild them", partition, topics.telemetry, what, self.engine.pruned_to)
        held = sorted(self.engine.held - {partition})
        for p in held:
            self.store.save_partition(self.engine, p, self._section_offsets(p))
        started = self.engine.started
        self.engine.reset()
        self.engine.started = started
        self.offsets = {k: v for k, v in self.offsets.items() if k[0] == topics.telemetry}
        for tp in self.global_parts:
            self.globals.seek_to_beginning(tp)
        self._ends_stale = True
        for p in held:
            self.add_partition(p)
        if sec is not None:
            self.add_partition(partition)   # the books hold everything now
            return
        self.engine.start_partition(partition, None)
        self.offsets.pop((topics.telemetry, partition), None)
        log.info("partition %d of %s: from the start, with books rebuilt", partition,
                 topics.telemetry)

    def drop_partition(self, partition: int) -> None:
        """Save a revoked partition's section and let it go. (No group commit: this runs
        inside the consumer's rebalance, where it cannot block; the next holder resumes
        from the section, which holds the offset, and commits it.)"""
        if partition not in self.engine.held:
            return
        self._send_parts()
        self.producer.flush()
        telemetry = self.settings.topics.telemetry
        if partition != 0 and 0 in self.engine.held and self.engine.owner:
            # the owner took this partition's parts itself, into partition 0's state:
            # that state is saved first, or a kill before the next checkpoint loses
            # the parts this section says were reported
            self.store.save_partition(self.engine, 0, self._section_offsets(0))
        self.store.save_partition(self.engine, partition, self._section_offsets(partition))
        checkpoint.drop_partition(self.engine, partition)
        tele = (telemetry, partition)
        log.info("partition %d of %s: handed over (its checkpoint saved at offset %s)",
                 partition, telemetry, self.offsets.get(tele))
        self.offsets.pop(tele, None)
        self.partition_time.pop(tele, None)
        self._flushed_at.pop(partition, None)

    def _section_offsets(self, partition: int) -> dict[Key, int]:
        """The offsets a section of ``partition`` covers: its telemetry, the globals."""
        tele = (self.settings.topics.telemetry, partition)
        return {k: v for k, v in self.offsets.items()
                if k == tele or k[0] != self.settings.topics.telemetry}

    def _read_globals_to(self, wanted: dict[Key, int], timeout_s: float = 30.0) -> None:
        """Read the global topics at least as far as a section's books had read them, so
        that the engine's books hold every event the section's did."""
        deadline = time.monotonic() + timeout_s
        for _ in range(1000):
            short = [k for k in wanted if k[0] != self.settings.topics.telemetry
                     and k[0] != self.settings.topics.attempt_parts
                     and self.offsets.get(k, 0) < wanted[k]]
            if not short or time.monotonic() > deadline:
                if short:
                    log.warning("global topics not read as far as a handed-over section "
                                "(%s); its history fills the gap", short)
                return
            self._drain_globals(force=True)

    # -- the loop ------------------------------------------------------------------

    def install_signal_handlers(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM and SIGINT finish the batch, write a last checkpoint and stop. When
        that takes more than ``grace_s`` (a call to a broker that is down waits up to
        ``request_timeout_ms``: 305 s by default), or at a second signal, the process
        ends at once: the last checkpoint written stands, as after a kill."""
        def give_up(why: str) -> None:
            log.warning("%s: stopping without a last checkpoint (the one before stands; "
                        "the input since is read again at the next start)", why)
            logging.shutdown()
            os._exit(128 + signal.SIGTERM)

        def watchdog() -> None:
            if not self.closed.wait(grace_s):
                give_up(f"not stopped {grace_s:.0f} s after the signal")

        def handler(signum: int, _frame: object) -> None:
            if self.stop.is_set():
                give_up(f"signal {signum} again")
            log.info("signal %d: finishing the batch, then stopping", signum)
            self.stop.set()
            threading.Thread(target=watchdog, name="gpuledger-stop", daemon=True).start()
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def run(self) -> None:
        for call in self.on_engine:
            call(self.engine)
        self._idle_since: float | None = None
        self._flushed = False
        self._assigned_at = time.monotonic()
        backoff = 1.0
        reload = False  # the state is not the last checkpoint's yet (Kafka went away)
        outage = OutageLog(log, "reaching Kafka")
        while not self.stop.is_set():
            try:
                if reload:
                    self._reload()   # may fail again while Kafka is away: tried again
                    reload = False
                if self._step():
                    return
                backoff = 1.0
                outage.worked("on from the last checkpoint")
            except Exception as exc:
                if not _transient(exc):
                    raise
                self.stats.recoveries += 1
                outage.failed(error_text(exc, 200), "back to the last checkpoint, and on "
                              "from there once Kafka answers")
                reload = True
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
        if reload:  # stopped in an outage: the last checkpoint stands
            log.warning("stopped while Kafka was unavailable: the last checkpoint stands")
            return
        self.engine.write_partial()
        self._send_parts()
        self._checkpoint()
        log.info("stopped: partial hours written and checkpointed (partitions %s, %d "
                 "telemetry message(s) read here)", sorted(self.held), self.stats.messages)

    def _step(self) -> bool:
        """One turn of the loop; True once a batch run is done."""
        got = self._drain_globals()
        records = self._poll_telemetry()
        if records:
            self._ends_stale = True  # the global ends must be as new as this poll
            got += self._handle(_messages(records), telemetry=True)
        self._close_pending()
        if got or not self._caught_up():
            self._idle_since = None
        else:
            self._idle_since = self._idle_since or time.monotonic()
            limit = self.options.exit_when_idle_s
            idle = time.monotonic() - self._idle_since
            if limit is not None and idle >= limit:
                if not self._flushed:
                    log.info("no input for %.0f s: flushing", limit)
                    self._flush()
                    self._send_parts()
                    self._checkpoint()
                    self._flushed = True
                if self._group_settled() and self._others_done(idle, limit):
                    behind = self._partitions_behind()
                    if behind and idle < self._behind_wait_s(limit):
                        return False  # a dead member's partitions may yet come back here
                    self._flush()
                    self._checkpoint()
                    if behind:
                        self.unfinished = behind
                        log.warning("exiting with partition(s) %s of %s not processed "
                                    "and flushed to their end by any instance (a member "
                                    "that died holds them until its session times out; "
                                    "a live one without --exit-when-idle does not flush): "
                                    "run again on this group to process them (%d telemetry "
                                    "message(s) read here)", ", ".join(map(str, behind)),
                                    self.settings.topics.telemetry, self.stats.messages)
                    else:
                        log.info("all input processed: exiting (%d telemetry "
                                 "message(s) read here)", self.stats.messages)
                    return True
        if time.monotonic() - self._last_checkpoint >= self.options.checkpoint_interval_s:
            self._checkpoint()
        self._log_progress()
        return False

    def _flush(self) -> None:
        """A batch run's flush: every minute closed and written; the offsets it covers
        are marked flushed in this instance's next commits."""
        self.engine.flush()
        telemetry = self.settings.topics.telemetry
        self._flushed_at = {p: self.offsets[(telemetry, p)] for p in self.engine.held
                            if (telemetry, p) in self.offsets}

    def _behind_wait_s(self, limit: float) -> float:
        """How long a batch run waits for partitions no instance has flushed to their
        end: ten idle periods, and at least twice a session and its heartbeats (a member
        killed before its flush holds its partitions that long, then they come here)."""
        o = self.options
        return max(10 * limit, 2 * (o.session_timeout_ms + 2 * o.heartbeat_interval_ms) / 1000)

    def _seek_globals(self) -> None:
        """Load the engine's global state from the checkpoint and read the global topics
        from the offsets it holds (from the beginning where it holds none)."""
        loaded = self.store.load_global(self.engine)
        for tp in self.global_parts:
            key = (tp.topic, tp.partition)
            if loaded is not None and key in loaded:
                self._check_offset(key, loaded[key], f"{self.store.store.url} (global "
                                   "checkpoint)")
                self.offsets[key] = loaded[key]
                self.globals.seek(tp, loaded[key])
            else:
                self.globals.seek_to_beginning(tp)

    def _reload(self) -> None:
        """Forget what was done since the last checkpoint and go back to it: the engine's
        state, the offsets of every input (the facts written since are written again, the
        same bytes)."""
        held = sorted(self.engine.held)
        self.engine.reset()
        self.offsets = {}
        self.partition_time = {}
        self._ends_stale = True
        self._flushed = False
        self._flushed_at = {}
        self._seek_globals()
        for p in held:
            self.add_partition(p)
            tp = self._tp(self.settings.topics.telemetry, p)
            offset = self.offsets.get((tp.topic, tp.partition))
            if offset is not None:
                self.telemetry.seek(tp, offset)
            else:
                self.telemetry.seek_to_beginning(tp)

    def poll_size(self) -> int:
        """Messages the next telemetry poll may take: ``max_poll_samples`` worth at the
        last poll's samples per message, within ``max_records`` (500 before any)."""
        o = self.options
        if self._samples_per_message is None:
            return min(o.max_records, 500)
        return max(1, min(o.max_records, int(o.max_poll_samples / self._samples_per_message)))

    def _poll_telemetry(self) -> dict[Any, list[Any]]:
        records = self.telemetry.poll(timeout_ms=self.options.poll_timeout_ms,
                                      max_records=self.poll_size())
        if self.rebalance_failure is not None:
            raise self.rebalance_failure
        held = self.engine.held
        return {tp: recs for tp, recs in records.items() if tp.partition in held}

    def _caught_up(self) -> bool:
        """Telemetry partitions assigned and every input read to its end."""
        if not self.engine.held:
            return False
        self._refresh_ends(force=True)
        return all(self.offsets.get(key, 0) >= end for key, end in self._ends.items())

    def _others_done(self, idle_s: float, limit: float) -> bool:
        """Batch exit: the owner waits for the other instances' last attempt parts.

        They are in once every partition held elsewhere has sent its end-of-input marker
        (after its last parts), every telemetry partition's committed group offset is at
        its end and the parts topic is read to its end here; after ten idle periods the
        owner exits anyway (its checkpoint keeps what waits, a later run finishes it)."""
        engine = self.engine
        if not engine.owner or self.partitions == 1:
            return True
        others = set(range(self.partitions)) - engine.held
        if not others:
            return engine.waiting.is_empty() or idle_s >= 10 * limit
        if idle_s >= 10 * limit:
            log.warning("%d attempt(s) still wait for other instances' parts; exiting with "
                        "them in the checkpoint", engine.waiting.height)
            return True
        if not self._group_at_end():
            return False
        self._refresh_ends(force=True)
        parts = [(tp.topic, tp.partition) for tp in self.global_parts
                 if tp.topic == self.settings.topics.attempt_parts]
        if any(self.offsets.get(k, 0) < self._ends.get(k, 0) for k in parts):
            return False  # parts sent before those commits are not read yet
        if not others <= engine.flushed_shards:
            return False  # a partition has not flushed (sent its last running parts) yet
        return engine.waiting.is_empty()

    def _group_settled(self) -> bool:
        """Batch exit: every partition is with a live instance. One that holds them all
        knows it; otherwise a member killed without leaving may still hold some (its
        partitions come back only when its session expires, up to ``session_timeout_ms``
        after its last heartbeat, and the others hear of it at their next heartbeat).
        Instances that exited then, each having flushed its own partitions, left a dead
        member's unflushed for good: in a chaos run, partition 0's last hour was never
        written. So the assignment must have stood that long."""
        if not set(range(self.partitions)) - self.engine.held:
            return True
        o = self.options
        settle_s = (o.session_timeout_ms + 2 * o.heartbeat_interval_ms) / 1000
        return time.monotonic() - self._assigned_at >= settle_s

    def _group_at_end(self) -> bool:
        return not self._partitions_behind(every=True)

    def _partitions_behind(self, every: bool = False) -> list[int]:
        """The telemetry partitions not flushed to their end: those not held here (all
        with ``every``) whose holder has not committed their end after a flush (its
        commit's metadata says so: ``group_claim.FLUSHED``). An instance that exited on
        its own partitions' end said "all input processed" while a killed member's
        partitions had not been read (its longer session timeout held them), with exit
        status 0; and, on committed offsets alone, while a member killed after reading
        to the end and before its flush had the last hour of its partitions (and the
        cluster-wide facts) in its checkpoint only."""
        held = set() if every else self.engine.held
        rest = [p for p in range(self.partitions) if p not in held]
        if not rest:
            return []
        from kafka.admin import KafkaAdminClient

        topic = self.settings.topics.telemetry
        wait = self.options.session_timeout_ms
        admin = KafkaAdminClient(**self.settings.client_config(), request_timeout_ms=wait)
        try:
            group = self.options.group_id
            committed = admin.list_group_offsets({group: None}).get(group, {})
        finally:
            admin.close()
        tps = {p: self._tp(topic, p) for p in rest}
        ends = self.globals.end_offsets(list(tps.values()), timeout_ms=wait)
        now = time.time()

        def flushed(p: int, tp: Any) -> bool:
            if tp not in committed or committed[tp].offset < ends[tp]:
                return False
            claim = group_claim.parse(p, committed[tp].metadata, now)
            return claim is not None and claim.flushed
        return [p for p, tp in tps.items()   # an empty partition is done unless `every`
                if (ends[tp] > 0 or every) and not flushed(p, tp)]

    def close(self) -> None:
        self.closing = True  # the final checkpoint is written; revocation needs none
        for client in (self.telemetry, self.globals):
            client.close(autocommit=False)
        self.producer.flush()
        self.producer.close()
        self.engine.warehouse.close()
        self.closed.set()

    def _drain_globals(self, force: bool = False) -> int:
        """Read what the global topics hold now (up to ``max_records`` messages), decode
        it once and hand it to the engine in one batch: a batch has a fixed cost, and a
        topic read in many small fetches would pay it for each. Not before the instance
        holds a partition (``force``: a partition is being taken over)."""
        if not force and not self.engine.held:
            return 0
        by_topic: dict[str, list[Message]] = {}
        total = 0
        self._refresh_ends()
        while total < self.options.max_records:
            # wait for the next fetch while the global topics hold more (a fetch may
            # bring only part of what is there)
            unread = any(self.offsets.get((tp.topic, tp.partition), 0)
                         < self._ends.get((tp.topic, tp.partition), 0)
                         for tp in self.global_parts)
            records = self.globals.poll(timeout_ms=50 if unread else 0,
                                        max_records=self.options.max_records - total)
            fetched = _messages(records)
            n = 0
            for topic, msgs in fetched.items():
                fresh = [m for m in msgs
                         if m.offset >= self.offsets.get((m.topic, m.partition), 0)]
                by_topic.setdefault(topic, []).extend(fresh)
                n += len(msgs)
                for m in msgs:
                    key = (m.topic, m.partition)
                    self.offsets[key] = max(self.offsets.get(key, 0), m.offset + 1)
            if n == 0:
                break
            total += n
        if total == 0:
            return 0
        self._handle(by_topic, telemetry=False)
        return total

    def _decode(self, topic: str, msgs: list[Message]) -> DecodedBatch | None:
        record_type = self.settings.topics.record_type_of(topic)
        if record_type is None:
            return None
        return decode(msgs, record_type,  # type: ignore[arg-type]
                      now=datetime.now(UTC), max_future_s=self.config.windows.max_future_s,
                      limits=self.config.limits)

    def _handle(self, by_topic: dict[str, list[Message]], telemetry: bool) -> int:
        """Decode what was read, send its bad records to dead letters and feed the rest
        to the engine in one batch."""
        frames: dict[str, pl.DataFrame] = {}
        count = 0
        topics = self.settings.topics
        engine = self.engine
        for topic, msgs in by_topic.items():
            if not msgs:
                continue
            if topic == topics.attempt_parts:
                if engine.owner:
                    for m in msgs:
                        parts = self._parts_of(m)
                        if parts is not None:
                            engine.receive_parts(parts)
            else:
                decoded = self._decode(topic, self._routed(msgs) if telemetry else msgs)
                if decoded is None:
                    continue
                record_type = topics.record_type_of(topic)
                # a bad global record is every instance's; the owner reports it
                if telemetry or engine.owner:
                    self._dead_letters(decoded)
                frame = decoded.frames[record_type]  # type: ignore[index]
                if telemetry:
                    self._samples_per_message = max(frame.height, 1) / len(msgs)
                    self.stats.samples += frame.height
                if frame.height:
                    frames[str(record_type)] = frame
                    self.partition_time.update(_last_message_times(msgs, frame))
            if telemetry:
                for m in msgs:
                    key = (m.topic, m.partition)
                    self.offsets[key] = max(self.offsets.get(key, 0), m.offset + 1)
            count += len(msgs)
        if telemetry:
            self.stats.messages += count
        if telemetry and not self._writers_checked:
            tele = frames.get(str(topics.record_type_of(topics.telemetry)))
            if tele is not None:
                self._refuse_other_writers(tele["time"].min())  # type: ignore[arg-type]
        if frames:
            limit, behind = self._time_limit()
            engine.process(frames, validated=True, event_time_limit=limit, behind=behind)
        self._send_parts()
        return count

    def _routed(self, msgs: list[Message]) -> list[Message]:
        """The telemetry messages that arrived on their node's partition (by key: Kafka's
        default murmur2 partitioner keyed by node, as the agent and the docs say). One
        that did not is a dead letter with the reason: an engine holding both partitions
        kept it and one holding only the partition it came on dropped it, so one instance
        and two wrote different facts."""
        partitioning = self.engine.partitioning
        assert partitioning is not None
        wrong = [m for m in msgs if m.key and partitioning.of(
            m.key.decode("utf-8", "replace")) != m.partition]
        if not wrong:
            return msgs
        rejects = [message_reject(m, (
            f"telemetry keyed by node {m.key.decode('utf-8', 'replace')[:80]!r} came on "
            f"partition {m.partition}; its node's partition is "
            f"{partitioning.of(m.key.decode('utf-8', 'replace'))} (producers must use "
            "Kafka's default murmur2 partitioner, keyed by node)"))
            for m in wrong if m.key]
        self._dead_letters(DecodedBatch({}, pl.concat(rejects)))
        gone = {id(m) for m in wrong}
        return [m for m in msgs if id(m) not in gone]

    def _parts_of(self, m: Message) -> pl.DataFrame | None:
        """The attempt parts of a message, in the exchange's columns; None for an empty
        one, and for one that cannot be read as parts, which is a dead letter with the
        reason (it crashed the owner, and every owner after it, until the topic's
        retention dropped it)."""
        if not m.value:
            return None
        try:
            return conform_parts(read_frame(m.value))
        except (Exception, PanicException) as exc:
            reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() \
                else type(exc).__name__
            self._dead_letters(DecodedBatch({}, message_reject(
                m, f"not attempt parts ({type(exc).__name__}: {reason})")))
            return None

    def _send_parts(self) -> None:
        """Send the engine's attempt parts to the owner (acknowledged before checkpoints)."""
        outbox = self.engine.outbox
        if not outbox:
            return
        for frame in outbox:
            shard = frame["shard"][0] if frame.height else 0
            self.producer.send(self.settings.topics.attempt_parts,
                               key=f"p{shard:03d}".encode(), value=encode_parts(frame))
            self.stats.parts_sent += 1
        outbox.clear()

    def _refresh_ends(self, force: bool = False) -> None:
        """End offsets of the engine's inputs. They are fetched again after every
        telemetry poll that returned records: a scheduler event produced before the
        telemetry just read is then known to be unread, and holds the watermark."""
        if not force and not self._ends_stale and time.monotonic() - self._ends_at <= 1.0:
            return
        tele = [self._tp(self.settings.topics.telemetry, p) for p in sorted(self.engine.held)]
        wait = self.options.session_timeout_ms
        ends = {**(self.globals.end_offsets(tele, timeout_ms=wait) if tele else {}),
                **self.globals.end_offsets(self.global_parts, timeout_ms=wait)}
        self._ends = {(tp.topic, tp.partition): off for tp, off in ends.items()}
        self._ends_at = time.monotonic()
        self._ends_stale = False

    def _time_limit(self) -> tuple[datetime | None, bool]:
        """Oldest time among the engine's input partitions with unread data (each one's
        by :func:`_last_message_times`), and whether any has unread data (the engine is
        *behind*; ``Processor.advance`` decides whether it is catching up).

        Its telemetry partitions and every scheduler/inventory partition count: minutes
        must not close while scheduler events for them may still be unread. A partition
        with unread data whose time is not known yet holds the watermark where it is; a
        partition read to its end holds nothing.
        """
        self._refresh_ends()
        topics = self.settings.topics
        behind: list[datetime] = []
        for key, end in self._ends.items():
            if key[0] == topics.attempt_parts or self.offsets.get(key, 0) >= end:
                continue
            if key[0] == topics.telemetry and key[1] not in self.engine.held:
                continue
            seen = self.partition_time.get(key)
            if seen is None:
                return self.engine.closed_until or HOLD, True
            behind.append(seen)
        return (min(behind) if behind else None), bool(behind)

    def _close_pending(self) -> None:
        """Close what the engine held back while behind, once it has nothing to read."""
        if self.engine.close_pending:
            limit, behind = self._time_limit()
            self.engine.advance(limit, behind)
            self._send_parts()

    def _dead_letters(self, decoded: DecodedBatch) -> None:
        dead = decoded.dead_letters
        if dead.is_empty():
            return
        self.stats.dead_letters += dead.height
        for (part,), rows in dead.group_by("partition"):
            is_tele = rows["topic"][0] == self.settings.topics.telemetry
            self.engine.add_rejects(rows.drop("topic", "partition", "offset"),
                                    int(part) if is_tele and part is not None else 0)
        topic = self.settings.topics.dead_letters
        for row in dead.iter_rows(named=True):
            headers = [("reason", str(row["reason"]).encode()),
                       ("source-topic", str(row["topic"] or "").encode()),
                       ("source-partition", str(row["partition"]).encode()),
                       ("source-offset", str(row["offset"]).encode())]
            self.producer.send(topic, value=str(row["raw"] or "").encode(), headers=headers)
        log.warning("%d bad record(s) sent to %s (first: %s)", dead.height, topic,
                    dead["reason"][0])

    def _checkpoint(self) -> None:
        """Save the engine's state with its offsets, then commit the telemetry offsets."""
        self._send_parts()
        # dead letters and parts acknowledged before the offsets
        self.producer.flush(timeout=self.options.session_timeout_ms / 1000)
        telemetry = self.settings.topics.telemetry
        global_offsets = {k: v for k, v in self.offsets.items() if k[0] != telemetry}
        per_partition = {p: {k: v for k, v in self.offsets.items() if k == (telemetry, p)}
                         for p in sorted(self.engine.held)}
        self.store.save(self.engine, global_offsets, per_partition)
        self._check_group()   # before this deployment's commits go to the group
        self._commit(per_partition)
        released = self.engine.warehouse.release_memory(force=True)  # decode buffers too
        log.debug("checkpoint: %.1f MiB of free heap handed back", released / 2**20)
        self.stats.checkpoints += 1
        self._last_checkpoint = time.monotonic()

    def _commit(self, per_partition: dict[int, dict[Key, int]]) -> None:
        from kafka.structs import OffsetAndMetadata

        topic = self.settings.topics.telemetry
        try:
            owned = {tp.partition for tp in self.telemetry.assignment()}
            now = time.time()

            def meta(p: int, offset: int) -> str:
                return group_claim.commit_metadata(self.deployment, now,
                                                   self._flushed_at.get(p) == offset)
            commits = {self._tp(topic, p): OffsetAndMetadata(
                           offs[(topic, p)], meta(p, offs[(topic, p)]), -1)
                       for p, offs in per_partition.items()
                       if p in owned and (topic, p) in offs}
            if commits:
                self.telemetry.commit(commits, timeout_ms=self.options.session_timeout_ms)
        except Exception as exc:  # the group dropped us: rejoin, the sections hold all
            if not _rejoin_error(exc):
                raise
            self.stats.rejoins += 1
            log.warning("offset commit refused (%s: %s): the group had dropped this "
                        "instance; it rejoins and goes on from its checkpoint",
                        type(exc).__name__, exc)

    def _log_progress(self) -> None:
        """The progress line, every ``log_interval_s``; while nothing changes (no message
        read, nothing closed, the same partitions) every ``IDLE_LOG_EVERY`` intervals.
        The rate is of the messages read since the last line."""
        now = time.monotonic()
        since = now - self._last_log
        if since < self.options.log_interval_s:
            return
        held = sorted(self.engine.held)
        seen = (self.stats.messages, self.engine.closed_until, held)
        if seen == self._last_logged \
                and since < IDLE_LOG_EVERY * self.options.log_interval_s:
            return
        read = self.stats.messages - (self._last_logged[0] if self._last_logged else 0)
        self._last_log, self._last_logged = now, seen
        lag = 0
        telemetry = self.settings.topics.telemetry
        for p in self.engine.held:
            high = self._ends.get((telemetry, p))
            if high is not None:
                lag += max(high - self.offsets.get((telemetry, p), 0), 0)
        c = self.counters()
        log.info("partitions=%s messages=%d (%.0f/s) samples=%d lag=%d closed_until=%s "
                 "dead_letters=%d rejected=%d late=%d rss_mib=%.0f memory_released_mib=%.0f",
                 held, self.stats.messages, read / max(since, 1e-9),
                 self.stats.samples, lag, self.engine.closed_until,
                 self.stats.dead_letters, sum(c.rejected.values()), c.late_telemetry,
                 (rss_bytes() or 0) / 2**20,
                 self.engine.warehouse.release_memory.released / 2**20)


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
    """Save and drop revoked partitions; load assigned ones and seek to their offsets."""

    def __init__(self, service: KafkaProcessorService) -> None:
        self.service = service

    def on_partitions_revoked(self, revoked: Any) -> None:
        if self.service.closing:
            return
        try:
            for tp in revoked:
                self.service.drop_partition(tp.partition)
        except Exception as exc:  # raised by the loop after the poll (not logged here)
            self.service.rebalance_failure = self.service.rebalance_failure or exc

    def on_partitions_assigned(self, assigned: Any) -> None:
        try:
            self._assigned(assigned)
        except Exception as exc:  # raised by the loop after the poll, before any record
            self.service.rebalance_failure = self.service.rebalance_failure or exc

    def _assigned(self, assigned: Any) -> None:
        service = self.service
        service._assigned_at = time.monotonic()
        for tp in assigned:
            if tp.partition not in service.engine.held:
                service.add_partition(tp.partition)
                service._flushed = False  # a batch run flushes (and marks) it too
            offset = service.offsets.get((tp.topic, tp.partition))
            if offset is not None:
                service.telemetry.seek(tp, offset)
            else:
                service.telemetry.seek_to_beginning(tp)
