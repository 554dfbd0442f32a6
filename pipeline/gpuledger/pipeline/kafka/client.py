"""Which Kafka library the service's consumers and dead-letter producer run on.

The service is written against the calls below: kafka-python's ``KafkaConsumer`` and
``KafkaProducer`` have them as they are (the default, ``GPULEDGER_KAFKA_CLIENT`` unset or
``kafka-python``); ``GPULEDGER_KAFKA_CLIENT=confluent`` gives adapters over librdkafka
(``client_confluent.py``, the ``kafka-fast`` extra) that present the same calls with the
same meaning. A kafka-python consumer of a group has two faults of its group join mended
(``group_join.py``). Options are passed by kafka-python's names (``group_id``,
``max_partition_fetch_bytes``, ...) whatever the client; the adapter translates them.

Offsets are committed only when the service says so (``enable_auto_commit=False``) with
either client: what ``commit`` is given is what the group stores, with its metadata
(``group_claim.py``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any, Protocol

from gpuledger.pipeline.kafka.settings import KafkaSettings


class TopicPartitionLike(Protocol):
    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...


class Consumer(Protocol):
    """The consumer calls the service makes (kafka-python's signatures)."""

    def subscribe(self, topics: Sequence[str], listener: Any = None) -> None: ...

    def assign(self, partitions: Sequence[Any]) -> None: ...

    def assignment(self) -> set[Any]: ...

    def partitions_for_topic(self, topic: str) -> set[int] | None: ...

    def seek(self, partition: Any, offset: int) -> None: ...

    def seek_to_beginning(self, *partitions: Any) -> None: ...

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[Any, list[Any]]:
        """Records by partition; each record has topic, partition, offset, key, value,
        headers (a list of (str, bytes)). Returns as soon as any are there."""
        ...

    def end_offsets(self, partitions: Collection[Any],
                    timeout_ms: int | None = None) -> dict[Any, int]:
        """The end offset of each partition; a ``KafkaTimeoutError`` past ``timeout_ms``
        (without one, kafka-python waited out the whole broker outage)."""
        ...

    def highwater(self, partition: Any) -> int | None: ...

    def commit(self, offsets: Mapping[Any, Any], timeout_ms: int | None = None) -> None:
        """Store these offsets (values with an ``offset`` attribute) for the group, now;
        a ``KafkaTimeoutError`` past ``timeout_ms`` (kafka-python's waited for as long as
        the broker was away, and the service said nothing of the outage)."""
        ...

    def committed(self, partition: Any, metadata: bool = False,
                  timeout_ms: int | None = None) -> Any:
        """The group's committed offset of ``partition`` (an ``OffsetAndMetadata`` when
        ``metadata``), or None."""
        ...

    def close(self, autocommit: bool = True) -> None: ...


class Producer(Protocol):
    """The producer calls the service makes (dead letters)."""

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
             headers: list[tuple[str, bytes]] | None = None) -> Any: ...

    def flush(self, timeout: float | None = None) -> None: ...

    def close(self, timeout: float | None = None) -> None: ...


def open_consumer(settings: KafkaSettings, **options: Any) -> Consumer:
    """A consumer of ``settings.client``'s library; ``options`` by kafka-python's names."""
    if settings.client == "confluent":
        from gpuledger.pipeline.kafka.client_confluent import ConfluentConsumer

        return ConfluentConsumer(settings, **options)
    from kafka import KafkaConsumer

    from gpuledger.pipeline.kafka import group_join

    consumer: Consumer = KafkaConsumer(**settings.client_config(), **options)
    if options.get("group_id") is not None:
        group_join.mend(consumer)
    return consumer


def open_producer(settings: KafkaSettings, **overrides: Any) -> Producer:
    """An idempotent, acks=all producer (``producer.producer_config``) of the chosen library."""
    if settings.client == "confluent":
        from gpuledger.pipeline.kafka.client_confluent import ConfluentProducer

        return ConfluentProducer(settings, **overrides)
    from kafka import KafkaProducer

    from gpuledger.pipeline.kafka.producer import producer_config

    producer: Producer = KafkaProducer(**producer_config(settings, **overrides))
    return producer


@contextlib.contextmanager
def held_back_client_lines() -> Iterator[list[str]]:
    """While clients first connect: kafka-python's own lines (at a closed port, a WARNING
    and two ERRORs for each try, 14 lines in its 30 s) are held back, not printed, and
    collected in the list given; the caller says in one line whether Kafka could be
    reached (:func:`first_reason`). Printed as they come when the library's log level
    was lowered to see them (``GPULEDGER_KAFKA_CLIENT_LOG=INFO``)."""
    library = logging.getLogger("kafka")
    held: list[str] = []
    if library.getEffectiveLevel() < logging.WARNING:
        yield held
        return

    class Holder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            text = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                text += f" ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
            held.append(text)

    holder, propagated = Holder(logging.WARNING), library.propagate
    library.addHandler(holder)
    library.propagate = False
    try:
        yield held
    finally:
        library.propagate = propagated
        library.removeHandler(holder)


def first_reason(held: list[str]) -> str:
    """The first of the client's held-back lines (the first try's failure: refused, a
    name not found, authentication), for an error's text; empty without one."""
    return f"first: {held[0][:200]}" if held else ""
