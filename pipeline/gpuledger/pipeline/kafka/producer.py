"""Publishing contract frames to Kafka: idempotent, acks=all, compressed, batched."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import polars as pl

from gpuledger.contract.schema import RECORD_TYPES
from gpuledger.pipeline.kafka.settings import KafkaSettings
from gpuledger.pipeline.kafka.wire import ARROW, FORMAT_HEADER, TYPE_HEADER, encode, split_by_key

log = logging.getLogger("gpuledger.kafka.producer")

KEYS = {"telemetry": "node", "inventory": "node", "job": "job_id"}


def producer_config(settings: KafkaSettings, **overrides: Any) -> dict[str, Any]:
    """kafka-python producer settings (``KafkaSettings.producer_config``)."""
    return settings.producer_config(**overrides)


class KafkaSink:
    """Publishes batches of frames, one message per key (node or job) and record type."""

    def __init__(self, settings: KafkaSettings, fmt: bytes = ARROW, **overrides: Any) -> None:
        from kafka import KafkaProducer

        self.settings = settings
        self.fmt = fmt
        self.producer = KafkaProducer(**producer_config(settings, **overrides))
        self.messages = 0
        self.bytes = 0

    def publish_batch(self, batch: Mapping[str, pl.DataFrame]) -> None:
        for record_type in RECORD_TYPES:
            frame = batch.get(record_type)
            if frame is None or frame.is_empty():
                continue
            topic = self.settings.topics.for_record_type(record_type)
            headers = [(FORMAT_HEADER, self.fmt), (TYPE_HEADER, record_type.encode())]
            for key, part in split_by_key(frame, KEYS[record_type]):
                value = encode(part, record_type, self.fmt)
                self.producer.send(topic, key=key.encode(), value=value, headers=headers)
                self.messages += 1
                self.bytes += len(value)

    def flush(self) -> None:
        self.producer.flush()

    def close(self) -> None:
        self.producer.flush()
        self.producer.close()
