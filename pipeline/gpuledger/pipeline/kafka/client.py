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

from collections.abc import Collection, Mapping, Sequence
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

    def end_offsets(self, partitions: Collection[Any]) -> dict[Any, int]: ...

    def highwater(self, partition: Any) -> int | None: ...

    def commit(self, offsets: Mapping[Any, Any]) -> None:
        """Store these offsets (values with an ``offset`` attribute) for the group, now."""
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
