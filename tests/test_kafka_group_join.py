"""A group member whose join round ends between two polls takes its assignment
(``group_join.py``: two faults of kafka-python 3.0.12, mended), with the real broker.

The round is made to end between polls the way a busy service makes it: the topic grows
partitions (a rejoin asked for by the metadata), and the consumer polls for no time and
then works (sleeps) before its next poll.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from kafka import KafkaAdminClient, KafkaConsumer
from kafka.admin import NewPartitions, NewTopic
from kafka_broker import Broker

from gpuledger.pipeline.kafka import group_join
from gpuledger.pipeline.kafka.client import Consumer, open_consumer
from gpuledger.pipeline.kafka.settings import KafkaSettings, Topics

GROUP_OPTIONS = dict(enable_auto_commit=False, session_timeout_ms=10_000,
                     heartbeat_interval_ms=3_000, auto_offset_reset="earliest",
                     metadata_max_age_ms=1_000)


@pytest.fixture
def admin(kafka: Broker) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        yield client
    finally:
        client.close()


def _held(consumer: Consumer) -> list[int]:
    return sorted(tp.partition for tp in consumer.assignment())


def _joined_with_two(consumer: Consumer, admin: KafkaAdminClient) -> str:
    """Subscribe ``consumer`` to a new topic of 2 partitions and wait until it holds both."""
    topic = f"join{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 2, 1)])
    consumer.subscribe([topic])
    deadline = time.monotonic() + 30
    while _held(consumer) != [0, 1] and time.monotonic() < deadline:
        consumer.poll(timeout_ms=200)
    assert _held(consumer) == [0, 1]
    return topic


def _busy_polls(consumer: Consumer, seconds: float) -> None:
    """Poll for no time, then work 0.3 s, until ``consumer`` holds 4 partitions."""
    deadline = time.monotonic() + seconds
    while _held(consumer) != [0, 1, 2, 3] and time.monotonic() < deadline:
        consumer.poll(timeout_ms=0)
        time.sleep(0.3)


def test_a_busy_member_takes_the_partitions_its_topic_grew_to(
        kafka: Broker, admin: KafkaAdminClient) -> None:
    # kafka-python 3.0.12 unmended: the round assigning 4 partitions ends between two
    # polls, and the member keeps [0, 1], with its heartbeat off, for as long as it runs
    settings = KafkaSettings(bootstrap=kafka.bootstrap, topics=Topics())
    consumer = open_consumer(settings, group_id=f"g{uuid.uuid4().hex[:6]}",
                             group_instance_id="one", **GROUP_OPTIONS)
    try:
        topic = _joined_with_two(consumer, admin)
        admin.create_partitions({topic: NewPartitions(4)})
        _busy_polls(consumer, 20)
        assert _held(consumer) == [0, 1, 2, 3]
    finally:
        consumer.close(autocommit=False)


def test_a_rejoin_outlasting_the_wait_is_joined_again_at_a_later_poll(
        kafka: Broker, admin: KafkaAdminClient) -> None:
    # the first mend alone (a round is never waited for): the rounds that end between
    # polls are thrown away, but the rejoin stays asked for, so the first poll that lasts
    # long enough joins; unmended, no later poll ever joins again
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap,
                             group_id=f"g{uuid.uuid4().hex[:6]}",
                             group_instance_id="one", **GROUP_OPTIONS)
    assert group_join.mend(consumer, join_wait_ms=0)
    try:
        topic = _joined_with_two(consumer, admin)
        admin.create_partitions({topic: NewPartitions(4)})
        _busy_polls(consumer, 3)
        deadline = time.monotonic() + 20
        while _held(consumer) != [0, 1, 2, 3] and time.monotonic() < deadline:
            consumer.poll(timeout_ms=2_000)
        assert _held(consumer) == [0, 1, 2, 3]
    finally:
        consumer.close(autocommit=False)


def test_a_consumer_without_a_coordinator_is_left_as_it_is() -> None:
    class Bare:
        pass

    assert not group_join.mend(Bare())
