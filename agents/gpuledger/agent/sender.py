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

log = logging.getLogger("gpuledger.agent.sender")


REMIND_S = 60.0
"""While deliveries fail (a retry every few seconds), a warning says so this often."""


def _span(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


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
        self._clock = clock
        self._failing_since: float | None = None
        """When the deliveries started failing (None while they succeed)."""
        self._said_at = 0.0
        self._failed_tries = 0

    def _client(self) -> Any:
        if self._producer is None:
            self._producer = self._factory()
        return self._producer

    def drain(self) -> int:
        """Send one batch; returns how many messages were delivered and acknowledged."""
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
            if self._failing_since is not None:
                log.warning("delivering again after %s (%d tries failed); %d messages "
                            "left in the spool", _span(self._clock() - self._failing_since),
                            self._failed_tries, self.spool.backlog)
                self._failing_since = None
        if delivered < len(pending):
            self._failed(RuntimeError(f"{len(pending) - delivered} messages not confirmed"))
        return delivered

    def _failed(self, exc: Exception) -> None:
        self.errors += 1
        name, text = type(exc).__name__, str(exc)
        text = text.removeprefix(f"{name}: ")   # kafka-python's errors name themselves
        why = f"{name}: {text}" if text else name
        now = self._clock()
        if self._failing_since is None:
            self._failing_since, self._said_at, self._failed_tries = now, now, 1
            log.warning("delivery failed (%s); %d messages kept in the spool, retrying "
                        "(said again each minute while it fails)", why, self.spool.backlog)
        else:
            self._failed_tries += 1
            said = now - self._said_at >= REMIND_S
            if said:
                self._said_at = now
            log.log(logging.WARNING if said else logging.DEBUG,
                    "delivery still failing after %s (%d tries; the last: %s); %d messages "
                    "kept in the spool", _span(now - self._failing_since),
                    self._failed_tries, why, self.spool.backlog)
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.close(timeout=0)
            except Exception:
                log.debug("closing the producer failed", exc_info=True)

    def close(self, timeout_s: float | None = None) -> None:
        """Close the producer, waiting at most ``timeout_s`` (default ``send_timeout_s``)
        for what it still holds."""
        if self._producer is not None:
            self._producer.close(timeout=self.send_timeout_s if timeout_s is None
                                 else timeout_s)
            self._producer = None
