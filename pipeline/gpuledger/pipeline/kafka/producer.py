"""Publishing contract frames to Kafka: idempotent, acks=all, compressed, batched."""

from __future__ import annotations

import logging
import time
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
        self.delivered = 0
        """Messages the broker confirmed (counted by the producer's I/O thread)."""
        self.failed = 0
        self.first_error: str | None = None
        self.last_delivery = time.monotonic()
        self.sending_since: float | None = None
        """While a send waits (the broker's metadata, a full buffer): since when."""

    def _ok(self, _metadata: Any) -> None:
        self.delivered += 1
        self.last_delivery = time.monotonic()

    def _error(self, exc: BaseException) -> None:
        self.failed += 1
        if self.first_error is None:
            self.first_error = f"{type(exc).__name__}: {exc}"[:300]

    @property
    def waiting(self) -> int:
        """Messages sent and neither confirmed nor failed yet."""
        return self.messages - self.delivered - self.failed

    def publish_batch(self, batch: Mapping[str, pl.DataFrame]) -> None:
        for record_type in RECORD_TYPES:
            frame = batch.get(record_type)
            if frame is None or frame.is_empty():
                continue
            topic = self.settings.topics.for_record_type(record_type)
            headers = [(FORMAT_HEADER, self.fmt), (TYPE_HEADER, record_type.encode())]
            for key, part in split_by_key(frame, KEYS[record_type]):
                value = encode(part, record_type, self.fmt)
                self.sending_since = time.monotonic()
                future = self.producer.send(topic, key=key.encode(), value=value,
                                            headers=headers)
                self.sending_since = None
                future.add_callback(self._ok)
                future.add_errback(self._error)
                self.messages += 1
                self.bytes += len(value)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every message is confirmed or failed (False: ``timeout_s`` passed
        first)."""
        from kafka.errors import KafkaTimeoutError

        try:
            self.producer.flush(timeout=timeout_s)
        except KafkaTimeoutError:
            return False
        return True

    def close(self, timeout_s: float | None = None) -> bool:
        """Flush (up to ``timeout_s``) and close; False when messages were left
        unconfirmed."""
        flushed = self.flush(timeout_s)
        self.producer.close(timeout=0 if not flushed else None)
        return flushed
