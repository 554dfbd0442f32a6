"""Where alert events go: a Kafka topic, an Alertmanager-compatible webhook, a tally, a list.

A sink's ``publish(events, active)`` gets the events of one evaluation (each firing or
resolved once) and the alerts still firing. Sinks never raise into the processor: a
failed delivery is logged and counted (``failures``).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import threading
import time
import urllib.parse
from collections import deque
from typing import Any, Protocol

from gpuledger.deadline import shut_socket
from gpuledger.http_url import http_url_problem
from gpuledger.pipeline.alerts.model import Alert

log = logging.getLogger("gpuledger.alerts")

ALERTS_TOPIC = "gpuledger.alerts.v1"
"""The alerts topic (the topic prefix applies; key = alert/job/attempt, JSON value)."""
ALERTS_RETENTION_MS = 30 * 24 * 3_600_000


class AlertSink(Protocol):
    def publish(self, events: list[Alert], active: list[Alert]) -> None: ...


class TallySink:
    """Counts the alerts fired, by name: what the CLI's summary needs, in memory that
    does not grow with the events (a service runs for months; keeping every event would
    grow its memory by 1–2 MiB a simulated day on the default cluster)."""

    def __init__(self) -> None:
        self.fired: dict[str, int] = {}

    def publish(self, events: list[Alert], active: list[Alert]) -> None:
        for alert in events:
            if alert.status == "firing":
                self.fired[alert.name] = self.fired.get(alert.name, 0) + 1


class ListSink:
    """Keeps every event in memory, so it grows with them: for tests and short runs that
    inspect the events themselves."""

    def __init__(self) -> None:
        self.events: list[Alert] = []

    def publish(self, events: list[Alert], active: list[Alert]) -> None:
        self.events.extend(events)


def alerts_topic(settings: Any) -> str:
    """The alerts topic with the settings' topic prefix."""
    named = getattr(settings.topics, "alerts", None)
    if isinstance(named, str):
        return named
    prefix = str(settings.topics.telemetry).removesuffix("gpu.telemetry.v1")
    return prefix + ALERTS_TOPIC


SEND_WAIT_MS = 1_000
"""How long one send may wait for the broker (the topic's metadata, buffer space) before
the events of that evaluation are held: the producer's ``max_block_ms`` (60 s by
default, and the service's close pass waited that long in an outage, saying nothing)."""
HELD_MAX = 10_000
"""Alert events held for an unreachable broker, at most; the oldest past it are given up
(counted in ``failures`` and said)."""


class KafkaAlertSink:
    """One JSON message per event on the alerts topic (created when missing).

    ``publish`` hands the messages to the producer and returns: the producer delivers
    them in the background (acks=all, idempotent, in order), so a broker outage never
    holds up the processor's close pass. A send the producer cannot take within
    ``SEND_WAIT_MS`` (the broker is away) holds that event and the evaluation's later
    ones, and a delivery that failed on a retriable error holds its event again: held
    events go first at the next ``publish`` and at ``close``, so an outage loses none
    (up to ``HELD_MAX``). ``sent`` counts deliveries, ``failures`` events given up;
    ``close`` sends and waits for what is left (at most 30 s)."""

    def __init__(self, settings: Any, topic: str | None = None) -> None:
        from kafka import KafkaProducer

        from gpuledger.pipeline.kafka.producer import producer_config

        self.settings = settings
        self.topic = topic or alerts_topic(settings)
        self.ensure_topic()
        self.producer = KafkaProducer(**producer_config(settings, compression_type=None,
                                                        max_block_ms=SEND_WAIT_MS))
        self.sent = 0
        self.failures = 0
        self.held: deque[tuple[bytes, bytes]] = deque()
        """(key, value) of the events waiting for the broker, oldest first."""
        self._count = threading.Lock()

    def ensure_topic(self) -> None:
        from kafka.admin import KafkaAdminClient, NewTopic
        from kafka.errors import TopicAlreadyExistsError

        admin = KafkaAdminClient(**self.settings.client_config())
        try:
            if self.topic not in set(admin.list_topics()):
                with contextlib.suppress(TopicAlreadyExistsError):
                    admin.create_topics([NewTopic(self.topic, 1, 1, topic_configs={
                        "retention.ms": str(ALERTS_RETENTION_MS), "cleanup.policy": "delete"})])
        finally:
            admin.close()

    def publish(self, events: list[Alert], active: list[Alert]) -> None:
        was_held = len(self.held)
        self._hold([("/".join(str(k) for k in alert.key).encode(),
                     json.dumps(alert.message(), default=str).encode()) for alert in events])
        # what is held now, oldest first: an event whose delivery fails meanwhile (its
        # errback may run at once, in this thread) is appended for the next evaluation
        for _ in range(len(self.held)):
            if not self.held:  # given up meanwhile (``HELD_MAX``)
                break
            item = key, value = self.held[0]
            try:
                future = self.producer.send(self.topic, key=key, value=value)
            except Exception as exc:  # the broker is away: held, the processor goes on
                if not was_held:
                    self._say_away(exc)
                return
            with self._count:  # unless given up meanwhile (``HELD_MAX``)
                if self.held and self.held[0] is item:
                    self.held.popleft()
            future.add_callback(self._delivered).add_errback(self._undelivered, key, value)
        if was_held:
            log.info("alerts topic %s: %d held alert event(s) handed to the producer",
                     self.topic, was_held)

    def _delivered(self, _metadata: Any) -> None:
        with self._count:
            self.sent += 1

    def _undelivered(self, key: bytes, value: bytes, exc: BaseException) -> None:
        if getattr(exc, "retriable", False):
            if not self._hold([(key, value)]):
                self._say_away(exc)
            return
        with self._count:
            self.failures += 1
        log.warning("alerts topic %s: an alert event not sent: %s", self.topic, exc)

    def _hold(self, events: list[tuple[bytes, bytes]]) -> int:
        """Append ``events`` to what is held, giving up the oldest past ``HELD_MAX``;
        how many were held before."""
        with self._count:
            before = len(self.held)
            self.held.extend(events)
            over = max(0, len(self.held) - HELD_MAX)
            for _ in range(over):
                self.held.popleft()
            self.failures += over
        if over:
            log.warning("alerts topic %s: %d oldest held alert event(s) given up (more "
                        "than %d held)", self.topic, over, HELD_MAX)
        return before

    def _say_away(self, exc: BaseException) -> None:
        log.warning("alerts topic %s: broker not reachable (%s: %s); %d alert event(s) "
                    "held, sent once it answers", self.topic, type(exc).__name__,
                    str(exc)[:200], len(self.held))

    def close(self, timeout_s: float = 30.0) -> None:
        """Send what is held (tried again for up to ``timeout_s``: a broker just back
        may take some seconds to give the topic's metadata), then wait for the
        deliveries, all within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.held and time.monotonic() < deadline:
            self.publish([], [])
            if self.held:
                time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        try:
            self.producer.flush(timeout=max(1.0, deadline - time.monotonic()))
        except Exception as exc:
            log.warning("alerts topic %s: not every alert event sent at exit: %s",
                        self.topic, exc)
        self.producer.close(timeout=5)
        if self.held:
            log.warning("alerts topic %s: %d alert event(s) not sent at exit (the broker "
                        "did not answer)", self.topic, len(self.held))


def webhook_problem(url: str) -> str | None:
    """Why ``url`` cannot be an Alertmanager endpoint (``http_url.py``), or None."""
    problem = http_url_problem(url)
    if problem is not None and problem.startswith("expected"):
        return f"{problem} (e.g. http://alertmanager:9093/api/v2/alerts)"
    if problem is not None and problem.startswith("credentials"):
        return (f"{problem}; put Alertmanager behind a proxy on the host, or use the Kafka "
                "alerts topic")
    return problem


RETRY_STATUS = frozenset({408, 429})
"""HTTP answers besides 5xx that may pass (a POST that got one is tried again)."""
REPLY_BYTES = 64 << 10
"""At most this much of an answer's body is read (Alertmanager answers almost nothing)."""


class WebhookSink:
    """POSTs Alertmanager-shaped lists (``/api/v2/alerts``) to ``url``, from a thread of
    its own: ``publish`` only queues, so a slow or hung endpoint never holds up the
    processor's close pass.

    Events go out as they happen; alerts still firing are sent again every
    ``resend_s`` seconds (wall clock), as Prometheus does, so that Alertmanager does not
    time them out (its ``resolve_timeout``); Alertmanager de-duplicates notifications.

    A POST is one plain HTTP(S) request that must be answered within ``timeout_s`` in
    all (a server that trickles its answer is cut off); redirects are not followed (a 3xx
    is an answer like any other), and at most ``REPLY_BYTES`` of the answer are read. A
    POST that fails for a reason that may pass (no connection, a timeout, a broken
    answer, HTTP 5xx, 408 or 429) is tried again after 1, 2, 4 … up to ``retry_max_s``
    seconds, for at most ``retry_for_s`` seconds; later lists wait behind it, so a
    resolution never overtakes its firing. Any other answer (400: Alertmanager rejected
    the list; 3xx, 401, 404) is not retried. At most ``max_queued`` lists wait; past
    that the oldest waiting list is given up. Whatever is given up is logged and counted
    (``dropped``, in alert events).
    """

    def __init__(self, url: str, timeout_s: float = 5.0, resend_s: float = 60.0,
                 generator_url: str | None = None, retry_first_s: float = 1.0,
                 retry_max_s: float = 30.0, retry_for_s: float = 600.0,
                 max_queued: int = 256) -> None:
        problem = webhook_problem(url)
        if problem:
            raise ValueError(f"{url!r}: {problem}")
        self.url = url
        self.timeout_s = timeout_s
        self.resend_s = resend_s
        self.generator_url = generator_url
        self.retry_first_s = retry_first_s
        self.retry_max_s = retry_max_s
        self.retry_for_s = retry_for_s
        self.max_queued = max_queued
        self.posts = 0
        """POSTs Alertmanager accepted."""
        self.delivered = 0
        """Alert events in them."""
        self.failures = 0
        """POSTs that failed (each try of a retried list counts)."""
        self.dropped = 0
        """Alert events given up: retried for too long, rejected, or still queued (or
        being posted) at ``close``."""
        self._queued_at = -float("inf")
        self._queue: deque[list[dict[str, Any]]] = deque()
        self._in_flight: list[dict[str, Any]] | None = None
        self._cond = threading.Condition()
        self._closing = threading.Event()
        self._closed = False
        self._overflowing = False
        self._thread: threading.Thread | None = None

    def publish(self, events: list[Alert], active: list[Alert]) -> None:
        now = time.monotonic()
        if now - self._queued_at >= self.resend_s:
            sent = {a.key for a in events}
            events = events + [a for a in active if a.key not in sent]
        if not events:
            return
        body = [a.alertmanager(self.generator_url) for a in events]
        with self._cond:
            if self._closed:
                self.dropped += len(body)
                return
            if len(self._queue) >= self.max_queued:
                oldest = self._queue.popleft()
                self.dropped += len(oldest)
                if not self._overflowing:  # once per outage, not once per list
                    self._overflowing = True
                    log.warning("alert webhook %s: %d lists waiting; the oldest are given up "
                                "from now on (counted)", self.url, self.max_queued)
            self._queue.append(body)
            self._queued_at = now
            self._cond.notify_all()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._send_all, daemon=True,
                                                name="gpuledger-alert-webhook")
                self._thread.start()

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every queued list to be delivered or given up;
        True when none is left."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._in_flight is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued, waiting at most ``timeout_s`` in all; then stop, giving
        up (and logging) whatever is left, the list being posted included."""
        if self._closed:
            return
        deadline = time.monotonic() + timeout_s
        self.flush(timeout_s)
        self._closing.set()  # a retry's wait ends now
        with self._cond:
            left = sum(len(b) for b in self._queue)
            self._queue.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(max(0.0, min(deadline - time.monotonic(), self.timeout_s)))
        with self._cond:
            self._closed = True   # from now on the sender counts nothing
            if self._in_flight is not None:
                left += len(self._in_flight)
                self._in_flight = None
            self.dropped += left
        if left:
            log.warning("alert webhook %s: %d alert event(s) not delivered at exit",
                        self.url, left)

    # -- the sending thread ------------------------------------------------------------

    def _send_all(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing.is_set():
                    self._cond.wait()
                if not self._queue:
                    return
                body = self._in_flight = self._queue.popleft()
            try:
                self._send(body)
            except Exception:  # never let the sender die: what it held is given up
                log.exception("alert webhook %s: sending failed", self.url)
                self._count(dropped=len(body), done=body)
            with self._cond:
                if self._in_flight is body:
                    self._in_flight = None
                self._cond.notify_all()

    def _count(self, posts: int = 0, delivered: int = 0, failures: int = 0,
               dropped: int = 0, done: list[dict[str, Any]] | None = None) -> None:
        """Add to the counts (nothing once closed: ``close`` counted what was left).
        ``done``: the list whose outcome this is, no longer in flight — in the same step,
        so that ``close`` never counts it a second time."""
        with self._cond:
            if self._closed:
                return
            self.posts += posts
            self.delivered += delivered
            self.failures += failures
            self.dropped += dropped
            if delivered:
                self._overflowing = False
            if done is not None and self._in_flight is done:
                self._in_flight = None
                self._cond.notify_all()

    def _send(self, body: list[dict[str, Any]]) -> None:
        """POST one list, retrying while the failure may pass."""
        first = time.monotonic()
        delay = self.retry_first_s
        tries = 0
        data = json.dumps(body).encode()
        while True:
            tries += 1
            problem, retry = self._post(data)
            if problem is None:
                if tries > 1:
                    log.info("alert webhook %s: delivered after %d tries", self.url, tries)
                self._count(posts=1, delivered=len(body), done=body)
                return
            self._count(failures=1)
            if retry and not self._closing.is_set() and \
                    time.monotonic() - first + delay <= self.retry_for_s:
                if tries == 1:
                    log.warning("alert webhook %s: %s; trying again (for up to %.0f s)",
                                self.url, problem, self.retry_for_s)
                retry = not self._closing.wait(delay)   # only close() cuts it short
            else:
                retry = False
            if not retry:  # said first: once counted, flush() may return
                log.warning("alert webhook %s: %s; %d alert event(s) given up after %d "
                            "tr%s", self.url, problem, len(body), tries,
                            "y" if tries == 1 else "ies")
                self._count(dropped=len(body), done=body)
                return
            delay = min(delay * 2, self.retry_max_s)

    def _post(self, data: bytes) -> tuple[str | None, bool]:
        """POST ``data``: (None, _) when accepted (2xx), else (why, whether to try again).
        The whole request must be answered within ``timeout_s``."""
        parts = urllib.parse.urlsplit(self.url)
        connection = (http.client.HTTPSConnection if parts.scheme == "https"
                      else http.client.HTTPConnection)(parts.hostname or "", parts.port,
                                                       timeout=self.timeout_s)
        # past the deadline the socket is shut, whatever the server trickles
        late = threading.Event()
        watchdog = threading.Timer(self.timeout_s, _shut, (connection, late))
        watchdog.daemon = True
        watchdog.start()
        try:
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            connection.request("POST", path, body=data,
                               headers={"Content-Type": "application/json",
                                        "Content-Length": str(len(data))})
            reply = connection.getresponse()
            status, reason = reply.status, reply.reason
            reply.read(REPLY_BYTES)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            why = str(exc) or type(exc).__name__
            return (f"no answer within {self.timeout_s:g} s" if late.is_set()
                    else why.splitlines()[0]), True
        finally:
            watchdog.cancel()
            connection.close()
        if late.is_set():  # cut off mid-answer: what was read is not a whole answer
            return f"no answer within {self.timeout_s:g} s", True
        if 200 <= status < 300:
            return None, False
        return f"HTTP {status} {reason}".strip(), status >= 500 or status in RETRY_STATUS


def _shut(connection: http.client.HTTPConnection, late: threading.Event) -> None:
    late.set()
    shut_socket(connection.sock)
