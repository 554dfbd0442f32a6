"""pytest fixture for a real Kafka broker, one per test session (per xdist worker).

Import it where it is needed, for example in tests/conftest.py:

    from kafka_fixtures import kafka  # noqa: F401  (a fixture)

The broker is GPULEDGER_TEST_KAFKA_BOOTSTRAP's when that is set (see
docs/kafka-dev.md), otherwise one started from the jars of scripts/kafka-jars.sh,
with the SASL listener on. Under pytest-xdist every worker that runs a test using
it starts its own broker (each ~0.5 GiB of heap), so a test that stops and restarts
its worker's broker disturbs no other worker. (`--dist loadgroup` with
`xdist_group` marks would keep them on one worker, but pytest 9.2 with xdist 3.8
silently ignores the marks: pytest-xdist issue #1386.)

The fixture may be imported into several modules (each import is a separate
fixture definition to pytest): they share one broker, stopped when the last of
them is torn down.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafka_broker import Broker, broker_from_env, start_broker

_shared: Broker | None = None
_users = 0


def _acquire(tmp_path_factory: pytest.TempPathFactory) -> Broker:
    global _shared, _users
    if _shared is None:
        env_broker = broker_from_env()
        if env_broker is not None:
            _shared = env_broker
        else:
            t0 = time.monotonic()
            _shared = start_broker(tmp_path_factory.mktemp("kafka"), sasl=True)
            print(f"\nKafka test broker up in {time.monotonic() - t0:.1f} s at {_shared.bootstrap}")
    _users += 1
    return _shared


def _release() -> None:
    global _shared, _users
    _users -= 1
    if _users == 0 and _shared is not None:
        _shared.stop()
        _shared = None


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """The session's Kafka broker (PLAINTEXT `bootstrap`, SASL `sasl_bootstrap` + `users`).

    A test that stops it (stop_process) must start it again before it ends.
    """
    broker = _acquire(tmp_path_factory)
    try:
        yield broker
    finally:
        _release()


def topic_messages(bootstrap: str, *topics: str, idle_ms: int = 5000) -> list[Any]:
    """Every message of ``topics`` from their start (kafka-python's records: ``topic``,
    ``key``, ``value``, ``headers``…), read until they stay quiet ``idle_ms``."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(*topics, bootstrap_servers=bootstrap, group_id=None,
                             auto_offset_reset="earliest", consumer_timeout_ms=idle_ms)
    try:
        return list(consumer)
    finally:
        consumer.close()


def topic_values(bootstrap: str, topic: str, idle_ms: int = 5000) -> list[bytes]:
    """Every value of ``topic`` from its start (:func:`topic_messages`)."""
    return [m.value for m in topic_messages(bootstrap, topic, idle_ms=idle_ms)]
