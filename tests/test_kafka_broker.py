"""The real test broker: loopback only, round trips, SASL, and a restart that keeps data."""

from __future__ import annotations

import contextlib
import logging
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError
from kafka_broker import Broker, broker_from_env
from kafka_fixtures import kafka  # noqa: F401  (the session fixture)

WAIT_S = 30.0


def _topic(prefix: str) -> str:
    return f"gpuledger-test-{prefix}-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def _producer(**kwargs: Any) -> Iterator[Any]:
    producer = KafkaProducer(
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        bootstrap_timeout_ms=int(WAIT_S * 1000),
        request_timeout_ms=10_000,
        delivery_timeout_ms=int(WAIT_S * 1000),
        **kwargs,
    )
    try:
        yield producer
    finally:
        producer.close(timeout=10)


def _produce(kwargs: dict[str, Any], topic: str, values: list[bytes]) -> None:
    with _producer(**kwargs) as producer:
        futures = [
            producer.send(topic, key=str(i % 7).encode(), value=v) for i, v in enumerate(values)
        ]
        producer.flush(timeout=WAIT_S)
        for future in futures:
            future.get(timeout=WAIT_S)


def _read_all(
    kwargs: dict[str, Any], topic: str, expected: int, *, group_id: str | None = None
) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every record, reading until `expected` came plus a
    short quiet spell (to catch duplicates); bounded by WAIT_S."""
    consumer = KafkaConsumer(
        bootstrap_timeout_ms=int(WAIT_S * 1000),
        request_timeout_ms=10_000,
        group_id=group_id,
        auto_offset_reset="earliest",
        enable_auto_commit=group_id is not None,
        **kwargs,
    )
    try:
        if group_id is None:
            parts = consumer.partitions_for_topic(topic)
            assert parts, f"no partitions for {topic}"
            consumer.assign([TopicPartition(topic, p) for p in sorted(parts)])
            consumer.seek_to_beginning()
        else:
            consumer.subscribe([topic])
        got: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + WAIT_S
        quiet_until: float | None = None
        while time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=200)
            for records in batch.values():
                got += [(r.partition, r.offset, r.value) for r in records]
            if len(got) >= expected:
                if quiet_until is None:
                    quiet_until = time.monotonic() + 0.5
                elif time.monotonic() >= quiet_until:
                    break
        return got
    finally:
        consumer.close()


def _listening(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        return s.connect_ex((host, port)) == 0


def test_broker_listens_on_loopback_only(kafka: Broker) -> None:  # noqa: F811
    host = kafka.bootstrap.rpartition(":")[0]
    if not kafka.managed:
        pytest.skip("broker from GPULEDGER_TEST_KAFKA_BOOTSTRAP: not ours to inspect")
    assert host == "127.0.0.1"
    assert kafka.running
    assert kafka.sasl_bootstrap is not None
    assert kafka.sasl_bootstrap.startswith("127.0.0.1:")
    assert set(kafka.ports) == {"plaintext", "controller", "sasl"}
    for port_no in kafka.ports.values():
        assert _listening("127.0.0.1", port_no)
        # Bound to 127.0.0.1 itself, not to every address: another loopback address
        # (still this machine) is refused.
        assert not _listening("127.0.0.2", port_no)
    assert kafka.start_seconds < 90
    admin = KafkaAdminClient(**kafka.client_kwargs(), bootstrap_timeout_ms=10_000)
    try:
        cluster = admin.describe_cluster()
    finally:
        admin.close()
    assert [b["host"] for b in cluster["brokers"]] == ["127.0.0.1"]


def test_thousand_messages_round_trip_exactly(kafka: Broker) -> None:  # noqa: F811
    topic = _topic("roundtrip")
    kafka.create_topic(topic, partitions=3)
    admin = KafkaAdminClient(**kafka.client_kwargs(), bootstrap_timeout_ms=10_000)
    try:
        assert topic in admin.list_topics()
    finally:
        admin.close()

    values = [f"msg-{i:04d}".encode() for i in range(1000)]
    _produce(kafka.client_kwargs(), topic, values)
    got = _read_all(kafka.client_kwargs(), topic, 1000, group_id=f"g-{uuid.uuid4().hex[:8]}")

    assert sorted(v for _, _, v in got) == sorted(values)  # all, each exactly once
    for partition in {p for p, _, _ in got}:
        offsets = [o for p, o, _ in got if p == partition]
        assert offsets == sorted(offsets)
        assert offsets == list(range(len(offsets)))  # no gaps: idempotent, no retries seen


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_sasl_round_trip(kafka: Broker, mechanism: str) -> None:  # noqa: F811
    if kafka.sasl_bootstrap is None or not kafka.users:
        pytest.skip("no SASL listener/user (set GPULEDGER_TEST_KAFKA_SASL_* for your broker)")
    topic = _topic(mechanism.lower())
    kafka.create_topic(topic)
    values = [f"{mechanism}-{i}".encode() for i in range(50)]
    _produce(kafka.client_kwargs(mechanism), topic, values)
    got = _read_all(kafka.client_kwargs(mechanism), topic, len(values))
    assert [v for _, _, v in got] == values


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_sasl_wrong_password_is_refused(
    kafka: Broker,  # noqa: F811
    mechanism: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if kafka.sasl_bootstrap is None or not kafka.users:
        pytest.skip("no SASL listener/user (set GPULEDGER_TEST_KAFKA_SASL_* for your broker)")
    bad = kafka.client_kwargs(mechanism) | {"sasl_plain_password": "not-the-password"}
    caplog.set_level(logging.ERROR, logger="kafka")
    log_start = kafka.log_path.stat().st_size if kafka.log_path else 0
    t0 = time.monotonic()
    with pytest.raises(KafkaError):
        admin = KafkaAdminClient(**bad, bootstrap_timeout_ms=2000, request_timeout_ms=2000)
        try:
            admin.list_topics()
        finally:
            admin.close()
    assert time.monotonic() - t0 < 20
    if kafka.log_path is not None:
        # The broker says why. (The client does not always: kafka-python sometimes sees
        # only "socket disconnected" before the error response, then times out.)
        deadline = time.monotonic() + 5
        while True:
            with kafka.log_path.open("rb") as fh:
                fh.seek(log_start)
                new_lines = fh.read().decode("utf-8", "replace")
            if "Failed authentication with /127.0.0.1" in new_lines:
                break
            assert time.monotonic() < deadline, f"no failed authentication logged:\n{new_lines}"
            time.sleep(0.1)
    else:
        assert "SaslAuthenticationFailedError" in caplog.text or "disconnected" in caplog.text

    # ... while the right password on the same listener works.
    admin = KafkaAdminClient(**kafka.client_kwargs(mechanism), bootstrap_timeout_ms=10_000)
    try:
        admin.list_topics()
    finally:
        admin.close()


def test_stop_and_start_again_keeps_data_and_port(kafka: Broker) -> None:  # noqa: F811
    if not kafka.managed:
        pytest.skip("broker from GPULEDGER_TEST_KAFKA_BOOTSTRAP: not ours to restart")
    topic = _topic("restart")
    kafka.create_topic(topic)
    values = [f"before-restart-{i}".encode() for i in range(100)]
    _produce(kafka.client_kwargs(), topic, values)
    bootstrap, port = kafka.bootstrap, kafka.ports["plaintext"]
    pid = kafka.pid

    kafka.stop_process()
    try:
        assert not kafka.running
        assert not _listening("127.0.0.1", port)
    finally:
        kafka.start_again(timeout_s=90)

    assert kafka.running
    assert kafka.pid != pid
    assert kafka.bootstrap == bootstrap
    assert _listening("127.0.0.1", port)
    got = _read_all(kafka.client_kwargs(), topic, len(values))
    assert [v for _, _, v in got] == values
    # Writes work again after the restart.
    _produce(kafka.client_kwargs(), topic, [b"after-restart"])
    got = _read_all(kafka.client_kwargs(), topic, len(values) + 1)
    assert got[-1][2] == b"after-restart"


def test_broker_from_env() -> None:
    assert broker_from_env({}) is None
    env = {
        "GPULEDGER_TEST_KAFKA_BOOTSTRAP": "localhost:9092",
        "GPULEDGER_TEST_KAFKA_SASL_BOOTSTRAP": "localhost:9094",
        "GPULEDGER_TEST_KAFKA_SASL_USER": "alice",
        "GPULEDGER_TEST_KAFKA_SASL_PASSWORD": "s3cret",
    }
    broker = broker_from_env(env)
    assert broker is not None
    assert broker.bootstrap == "localhost:9092"
    assert broker.sasl_bootstrap == "localhost:9094"
    assert broker.users == {"alice": "s3cret"}
    assert not broker.managed
    assert broker.client_kwargs("SCRAM-SHA-512")["sasl_plain_username"] == "alice"
    broker.stop()  # a no-op for a broker that is not ours
    plain_only = broker_from_env({"GPULEDGER_TEST_KAFKA_BOOTSTRAP": "h:1"})
    assert plain_only is not None
    assert plain_only.sasl_bootstrap is None
    assert plain_only.users == {}
