"""Drains the spool into Kafka, in order, acknowledging only what the broker accepted.

The producer is idempotent with ``acks=all``; a batch is acknowledged in the spool only
up to the last message whose delivery the broker confirmed, so an outage (or an agent
restart during one) loses nothing and, because nothing unconfirmed is acknowledged,
replays from exactly where delivery stopped. Blocking is bounded: while the broker is
unreachable :meth:`Sender.drain` returns after ``send_timeout_s`` having sent nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from gpuledger.agent.spool import Spool
from gpuledger.outage_log import OutageLog, error_text

log = logging.getLogger("gpuledger.agent.sender")


class Sender:
    """Moves spooled messages to Kafka."""

    def __init__(self, spool: Spool, producer_factory: Callable[[], Any],
                 batch: int = 2_000, send_timeout_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.spool = spool
        self._factory = producer_factory
        self._producer: Any = None
        self.batch = batch
        self.send_timeout_s = send_timeout_s
        self.sent = 0
        self.last_success: float | None = None
        self.errors = 0
        self.outage = OutageLog(log, "delivery", clock)
        self._retired: list[Any] = []
        """Producers given up on after a failed delivery, not closed yet."""

    def _client(self) -> Any:
        if self._producer is None:
            self._producer = self._factory()
        return self._producer

    def drain(self) -> int:
        """Send one batch; returns how many messages were delivered and acknowledged."""
        if self._retired:
            self._close_retired(0)
        pending = self.spool.pending(self.batch)
        if not pending:
            return 0
        try:
            producer = self._client()
            futures = [producer.send(m.topic, key=m.key, value=m.value) for m in pending]
            producer.flush(timeout=self.send_timeout_s)
        except Exception as exc:
            self._failed(exc)
            return 0
        delivered = 0
        for future in futures:
            if not future.is_done or future.failed():
                break
            delivered += 1
        if delivered:
            self.spool.ack(pending[delivered - 1].number)
            self.sent += delivered
            self.last_success = time.time()
            self.outage.worked(f"{self.spool.backlog} messages left in the spool")
        if delivered < len(pending):
            self._failed(RuntimeError(f"{len(pending) - delivered} messages not confirmed"))
        return delivered

    def _failed(self, exc: Exception) -> None:
        self.errors += 1
        self.outage.failed(error_text(exc), f"{self.spool.backlog} messages kept in the spool")
        producer, self._producer = self._producer, None
        if producer is not None:
            self._retired.append(producer)
            self._close_retired(0)

    def _close_retired(self, timeout_s: float) -> None:
        """Close the producers given up on. One still holding records cannot close
        (kafka-python flushes first, and the flush fails) until they expire, after the
        delivery timeout: it is kept and tried again at each drain. Left to the garbage
        collector, its close failed there and printed a traceback."""
        for producer in list(self._retired):
            try:
                producer.close(timeout=timeout_s)
            except Exception:
                log.debug("closing a producer given up on failed; tried again later",
                          exc_info=True)
            else:
                self._retired.remove(producer)

    def close(self, timeout_s: float | None = None) -> None:
        """Close the producer, waiting at most ``timeout_s`` (default ``send_timeout_s``)
        for what it still holds."""
        timeout = self.send_timeout_s if timeout_s is None else timeout_s
        if self._producer is not None:
            self._producer.close(timeout=timeout)
            self._producer = None
        self._close_retired(timeout)
