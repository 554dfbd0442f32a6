"""The agent's Kafka producer: settings, topics and delivery options.

Connection and security settings are the processor's (``GPULEDGER_KAFKA_*``, see
``docs/kafka.md``), read by ``gpuledger.pipeline.kafka.settings``, which is plain Python
(no Polars); the bootstrap and topic prefix may also come from the agent's
configuration. The producer is idempotent with ``acks=all``; its timeouts are bounded
by ``kafka.send_timeout_s`` so that an unreachable broker never blocks the agent for
longer (the spool keeps what was not confirmed).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from gpuledger.agent.config import AgentConfig
from gpuledger.pipeline.kafka.settings import KafkaSettings, load_settings


def kafka_settings(config: AgentConfig, environ: dict[str, str] | None = None
                   ) -> KafkaSettings:
    """Settings from the configuration and ``GPULEDGER_KAFKA_*`` (KafkaSettingsError)."""
    env = dict(os.environ) if environ is None else dict(environ)
    if config.kafka.topic_prefix:
        env["GPULEDGER_KAFKA_TOPIC_PREFIX"] = config.kafka.topic_prefix
    return load_settings(config.kafka.bootstrap, env,
                         given_by="set kafka.bootstrap in the agent configuration "
                                  "(GPULEDGER_AGENT__KAFKA__BOOTSTRAP)")


def producer_options(settings: KafkaSettings, send_timeout_s: float) -> dict[str, Any]:
    """Every wait of the producer bounded by ``send_timeout_s``: connecting to the
    bootstrap servers (kafka-python waits 30 s by default), metadata, requests,
    delivery."""
    budget_ms = max(1000, int(send_timeout_s * 1000))
    return settings.producer_config(
        request_timeout_ms=budget_ms // 2, delivery_timeout_ms=budget_ms,
        max_block_ms=budget_ms // 2, bootstrap_timeout_ms=budget_ms // 2,
        reconnect_backoff_max_ms=1000, client_id="gpuledger-agent")


def producer_factory(settings: KafkaSettings, send_timeout_s: float) -> Callable[[], Any]:
    """A callable that makes a kafka-python producer (the Sender calls it lazily)."""
    options = producer_options(settings, send_timeout_s)

    def make() -> Any:
        from kafka import KafkaProducer

        return KafkaProducer(**options)

    return make
