"""The service's Kafka calls on confluent-kafka (librdkafka), with kafka-python's meaning.

``GPULEDGER_KAFKA_CLIENT=confluent`` (install the ``kafka-fast`` extra). librdkafka
fetches, checks CRCs and decompresses in C, on its own threads; this module only hands
its messages over in kafka-python's shapes (``client.Consumer``, ``client.Producer``):

- ``poll`` returns records grouped by partition, as soon as any are queued (at most
  ``max_records``), like ``KafkaConsumer.poll``;
- offsets are never committed or stored automatically: ``commit`` stores exactly the
  offsets it is given, synchronously;
- the rebalance listener (kafka-python's ``on_partitions_revoked`` /
  ``on_partitions_assigned``) is called from ``poll``; seeks made inside
  ``on_partitions_assigned`` become the start offsets of the assignment;
- ``seek``/``seek_to_beginning`` right after ``assign`` set the start offsets;
- the dead-letter producer is idempotent with ``acks=all``; ``flush`` raises if a
  message could not be delivered, so the service never commits past a lost dead letter.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from typing import Any, NamedTuple

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
)
from confluent_kafka import TopicPartition as _TP
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from gpuledger.pipeline.kafka.settings import KafkaSettings

log = logging.getLogger("gpuledger.kafka.confluent")

TIMEOUT_S = 30.0
"""Metadata, watermark and commit requests give up after this long."""


class TopicPartition(NamedTuple):
    """Equal to (and hashes like) kafka-python's ``TopicPartition``."""

    topic: str
    partition: int


class Committed(NamedTuple):
    """A committed offset with its metadata, as kafka-python's ``OffsetAndMetadata``."""

    offset: int
    metadata: str
    leader_epoch: int = -1


class Record(NamedTuple):
    """A consumed message, with the attributes of kafka-python's ``ConsumerRecord``."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]


def base_config(settings: KafkaSettings) -> dict[str, Any]:
    """librdkafka settings for ``settings``: bootstrap, client id, security."""
    cfg: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap,
        "security.protocol": settings.security_protocol,
        "client.id": settings.client_id,
        "logger": log,
    }
    if settings.security_protocol.startswith("SASL"):
        cfg["sasl.mechanism"] = settings.sasl_mechanism or "PLAIN"
        cfg["sasl.username"] = settings.username
        cfg["sasl.password"] = settings.password
    if settings.security_protocol in ("SSL", "SASL_SSL") and settings.ssl_cafile:
        cfg["ssl.ca.location"] = settings.ssl_cafile
    return cfg


# kafka-python consumer option -> librdkafka property (None: handled by the adapter)
CONSUMER_OPTIONS: dict[str, str | None] = {
    "group_id": "group.id",
    "group_instance_id": "group.instance.id",
    "enable_auto_commit": "enable.auto.commit",
    "session_timeout_ms": "session.timeout.ms",
    "heartbeat_interval_ms": "heartbeat.interval.ms",
    "max_poll_interval_ms": "max.poll.interval.ms",
    "auto_offset_reset": "auto.offset.reset",
    "fetch_max_bytes": "fetch.max.bytes",
    "max_partition_fetch_bytes": "max.partition.fetch.bytes",
    "fetch_min_bytes": "fetch.min.bytes",
    "fetch_max_wait_ms": "fetch.wait.max.ms",
    "check_crcs": "check.crcs",
    "max_poll_records": None,
    "request_timeout_ms": None,  # librdkafka times requests out by its own socket settings
}


def consumer_config(settings: KafkaSettings, options: Mapping[str, Any]) -> dict[str, Any]:
    """librdkafka consumer settings from kafka-python-named ``options``."""
    cfg = base_config(settings)
    cfg.update({"enable.auto.commit": False, "enable.auto.offset.store": False,
                "enable.partition.eof": False, "fetch.queue.backoff.ms": 20})
    for name, value in options.items():
        if name not in CONSUMER_OPTIONS:
            raise ValueError(f"consumer option {name!r} has no confluent-kafka equivalent here")
        prop = CONSUMER_OPTIONS[name]
        if prop is None or value is None:
            continue
        cfg[prop] = value
    if cfg.get("enable.auto.commit"):
        raise ValueError("enable_auto_commit: the service commits offsets itself")
    if "group.id" not in cfg:  # assign-only reader: never joins a group, never commits
        cfg["group.id"] = f"{settings.client_id}-reader-{uuid.uuid4().hex}"
    if "fetch.max.bytes" in cfg:  # a response may be this large
        cfg["receive.message.max.bytes"] = int(cfg["fetch.max.bytes"]) + (1 << 20)
    return cfg


class ConfluentConsumer:
    """kafka-python's consumer calls (``client.Consumer``) on a librdkafka consumer."""

    def __init__(self, settings: KafkaSettings, **options: Any) -> None:
        self.max_records = int(options.get("max_poll_records") or 500)
        self._c = Consumer(consumer_config(settings, options))
        self._base = base_config(settings)
        self._admin: AdminClient | None = None
        self._assigned: set[TopicPartition] = set()
        self._start: dict[TopicPartition, int] | None = None  # assign() not applied yet
        self._seeks: dict[TopicPartition, int] | None = None  # inside on_assign
        self._listener: Any = None

    # -- assignment ------------------------------------------------------------------

    def subscribe(self, topics: Sequence[str], listener: Any = None) -> None:
        self._listener = listener
        self._c.subscribe(list(topics), on_assign=self._on_assign, on_revoke=self._on_revoke,
                          on_lost=self._on_revoke)

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        tps = {TopicPartition(p.topic, p.partition) for p in partitions}
        self._assigned = set(tps)
        self._seeks = {}
        try:
            if self._listener is not None:
                self._listener.on_partitions_assigned(tps)
            seeks = self._seeks
        finally:
            self._seeks = None
        consumer.assign([_TP(tp.topic, tp.partition, seeks.get(tp, OFFSET_INVALID))
                         for tp in sorted(tps)])

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        tps = {TopicPartition(p.topic, p.partition) for p in partitions}
        if self._listener is not None:
            self._listener.on_partitions_revoked(tps)
        self._assigned -= tps
        consumer.unassign()

    def assign(self, partitions: Sequence[Any]) -> None:
        self._assigned = {TopicPartition(p.topic, p.partition) for p in partitions}
        self._start = dict.fromkeys(self._assigned, OFFSET_INVALID)

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    def seek(self, partition: Any, offset: int) -> None:
        self._seek(TopicPartition(partition.topic, partition.partition), offset)

    def seek_to_beginning(self, *partitions: Any) -> None:
        for p in partitions or tuple(self._assigned):
            self._seek(TopicPartition(p.topic, p.partition), OFFSET_BEGINNING)

    def _seek(self, tp: TopicPartition, offset: int) -> None:
        if self._seeks is not None:
            self._seeks[tp] = offset
        elif self._start is not None:
            self._start[tp] = offset
        else:
            self._c.seek(_TP(tp.topic, tp.partition, offset))

    def _apply_assign(self) -> None:
        if self._start is not None:
            self._c.assign([_TP(tp.topic, tp.partition, off)
                            for tp, off in sorted(self._start.items())])
            self._start = None

    # -- reading ---------------------------------------------------------------------

    def poll(self, timeout_ms: int = 0, max_records: int | None = None
             ) -> dict[TopicPartition, list[Record]]:
        self._apply_assign()
        n = max_records or self.max_records
        msgs: list[Any] = self._c.consume(n, 0)  # what is queued already, without waiting
        if not msgs and timeout_ms > 0:
            first = self._c.poll(timeout_ms / 1000)  # wait for the first one
            if first is not None:
                msgs = [first, *self._c.consume(n - 1, 0)] if n > 1 else [first]
        out: dict[TopicPartition, list[Record]] = {}
        for m in msgs:
            err = m.error()
            if err is not None:
                self._error(err)
                continue
            topic, partition = m.topic(), m.partition()
            out.setdefault(TopicPartition(topic, partition), []).append(
                Record(topic, partition, m.offset(), m.key(), m.value() or b"",
                       m.headers() or []))
        return out

    @staticmethod
    def _error(err: Any) -> None:
        if err.fatal():
            raise KafkaException(err)
        if err.code() == KafkaError._PARTITION_EOF:
            return
        log.warning("consumer error (retried by the client): %s", err.str())

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        meta = self._c.list_topics(topic, timeout=TIMEOUT_S).topics.get(topic)
        if meta is None or meta.error is not None:
            return None
        return set(meta.partitions)

    def end_offsets(self, partitions: Collection[Any],
                    timeout_ms: int | None = None) -> dict[Any, int]:
        """One ListOffsets request per broker, on the admin client's own connections:
        the consumer's are busy with long-polling fetches, behind which a watermark
        query per partition waits up to ``fetch.wait.max.ms`` each."""
        if not partitions:
            return {}
        if self._admin is None:
            self._admin = AdminClient(self._base)
        wanted = {_TP(p.topic, p.partition): p for p in partitions}
        latest: OffsetSpec = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        futures = self._admin.list_offsets(
            {tp: latest for tp in wanted},
            request_timeout=TIMEOUT_S if timeout_ms is None else timeout_ms / 1000)
        return {wanted[tp]: int(f.result().offset) for tp, f in futures.items()}

    def highwater(self, partition: Any) -> int | None:
        _low, high = self._c.get_watermark_offsets(_TP(partition.topic, partition.partition),
                                                   cached=True)
        return int(high) if high >= 0 else None

    def commit(self, offsets: Mapping[Any, Any], timeout_ms: int | None = None) -> None:
        # librdkafka's synchronous commit is bounded by its own socket/request timeouts
        if not offsets:
            return
        self._c.commit(offsets=[_TP(tp.topic, tp.partition, int(getattr(om, "offset", om)),
                                    getattr(om, "metadata", None) or None)
                                for tp, om in offsets.items()], asynchronous=False)

    def committed(self, partition: Any, metadata: bool = False,
                  timeout_ms: int | None = None) -> Any:
        """The group's committed offset of ``partition`` (with its metadata when asked,
        as :class:`Committed`), or None when there is none."""
        timeout = timeout_ms / 1000 if timeout_ms is not None else TIMEOUT_S
        (tp,) = self._c.committed([_TP(partition.topic, partition.partition)],
                                  timeout=timeout)
        if tp.offset < 0:
            return None
        text = (tp.metadata or "").rstrip("\x00")  # librdkafka keeps the C string's NUL
        return Committed(int(tp.offset), text) if metadata else int(tp.offset)

    def close(self, autocommit: bool = True) -> None:
        # enable.auto.commit is off: closing commits nothing, whatever ``autocommit`` says
        self._c.close()


class ConfluentProducer:
    """kafka-python's ``send``/``flush``/``close`` on a librdkafka producer."""

    def __init__(self, settings: KafkaSettings, **overrides: Any) -> None:
        cfg = base_config(settings)
        cfg.update({"enable.idempotence": True, "acks": "all", "linger.ms": 20,
                    "compression.type": settings.compression,
                    "message.max.bytes": 8 << 20})
        names = {"compression_type": "compression.type", "linger_ms": "linger.ms",
                 "batch_size": "batch.size"}
        for name, value in overrides.items():
            if name == "max_block_ms":  # librdkafka's produce never waits for metadata
                continue
            if name not in names:
                raise ValueError(f"producer option {name!r} has no confluent-kafka "
                                 "equivalent here")
            cfg[names[name]] = value if value is not None else "none"
        self._p = Producer(cfg)
        self._failed: list[str] = []

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._failed.append(f"{msg.topic()}: {err.str()}")

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
             headers: list[tuple[str, bytes]] | None = None) -> None:
        while True:
            try:
                self._p.produce(topic, value=value, key=key, headers=headers,  # type: ignore[arg-type]
                                on_delivery=self._delivered)
                break
            except BufferError:  # the local queue is full: let deliveries drain
                self._p.poll(0.1)
        self._p.poll(0)

    def flush(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout if timeout is not None else 300.0)
        while self._p.flush(1.0) > 0:
            if time.monotonic() > deadline:
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT,
                                                "producer flush timed out"))
        if self._failed:
            failed, self._failed = self._failed, []
            raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT,
                                            f"{len(failed)} message(s) not delivered: "
                                            f"{failed[0]}"))

    def close(self, timeout: float | None = None) -> None:
        self.flush(timeout)
