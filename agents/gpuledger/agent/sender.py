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

from gpuledger.agent.spool import Message, Spool
from gpuledger.outage_log import OutageLog, error_text

log = logging.getLogger("gpuledger.agent.sender")

SET_ASIDE = "set-aside"
"""Folder in the spool for messages Kafka refuses for their size."""

TOO_LARGE = frozenset({"MessageSizeTooLargeError", "RecordListTooLargeError"})
"""kafka-python's errors for a record too large for the client's or the broker's limit.
Every record of a batch the broker refuses fails with the one too large (seen with an
idempotent producer), so :class:`Sender` sends such a batch again one message at a
time to find it."""


def too_large(exc: BaseException | None) -> bool:
    return exc is not None and type(exc).__name__ in TOO_LARGE


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
        self.set_aside = 0
        """Messages Kafka refused for their size (:meth:`_set_aside`)."""
        self._alone_through: int | None = None
        """After a batch refused as too large (kafka-python fails every record of a
        batch with the one too large), messages up to this number go one at a time, so
        that only the one Kafka refuses alone is set aside."""
        self._retired: list[Any] = []
        """Producers given up on after a failed delivery, not closed yet."""

    def _client(self) -> Any:
        if self._producer is None:
            self._producer = self._factory()
        return self._producer

    def drain(self) -> int:
        """Send one batch; returns how many messages left the spool (delivered and
        acknowledged, or set aside as too large for Kafka)."""
        if self._retired:
            self._close_retired(0)
        alone = self._alone_through is not None
        pending = self.spool.pending(1 if alone else self.batch)
        if not pending:
            return 0
        if alone and pending[0].number >= self._alone_through:  # type: ignore[operator]
            self._alone_through = None
        try:
            producer = self._client()
            futures = [producer.send(m.topic, key=m.key, value=m.value) for m in pending]
            producer.flush(timeout=self.send_timeout_s)
        except Exception as exc:
            self._failed(exc)
            return 0
        done = sent = 0      # done: sent, or set aside as too large for Kafka
        for message, future in zip(pending, futures, strict=True):
            if future.is_done and not future.failed():
                sent += 1
            elif future.is_done and too_large(future.exception):
                if len(pending) > 1:   # the batch failed whole: which one is too large?
                    self._alone_through = pending[-1].number
                    break
                self._set_aside(message, future.exception)
                self._retire()         # kafka-python's producer fails all after it
            else:
                break
            done += 1
        if done:
            self.spool.ack(pending[done - 1].number)
        if sent:
            self.sent += sent
            self.last_success = time.time()
            self.outage.worked(f"{self.spool.backlog} messages left in the spool")
        if done < len(pending):
            first = futures[done]
            cause = (f": {error_text(first.exception)}" if first.is_done and first.failed()
                     else "")
            self._failed(RuntimeError(f"{len(pending) - done} messages not confirmed{cause}"))
        return done

    def _set_aside(self, message: Message, exc: Exception) -> None:
        """A message Kafka refuses for its size can never be sent: retried, it held back
        every message after it, for good and across restarts. It is written to
        ``set-aside/`` in the spool folder (where it can, else only counted) and the
        messages after it go on."""
        self.set_aside += 1
        size = len(message.key) + len(message.value)
        folder = self.spool.folder / SET_ASIDE
        where = "it could not be kept"
        try:
            folder.mkdir(exist_ok=True)
            path = folder / f"{message.number:020d}.{message.topic}.msg"
            path.write_bytes(message.value)
            where = f"kept in {path}"
        except OSError as exc_write:
            where = f"it could not be kept ({exc_write.strerror or exc_write})"
        log.error("message %d (%s, %s bytes) set aside, %s: Kafka refuses it for its size "
                  "(%s). Raise the broker's message.max.bytes (and the topic's "
                  "max.message.bytes), or make it smaller (a labels file this big?)",
                  message.number, message.topic, f"{size:,}", where, error_text(exc))

    def _failed(self, exc: Exception) -> None:
        self.errors += 1
        self.outage.failed(error_text(exc), f"{self.spool.backlog} messages kept in the spool")
        self._retire()

    def _retire(self) -> None:
        """Give the producer up (a new one is made for the next drain)."""
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
