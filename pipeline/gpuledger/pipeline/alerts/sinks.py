"""Where alert events go: a Kafka topic, an Alertmanager-compatible webhook, a tally, a list.

A sink's ``publish(events, active)`` gets the events of one evaluation (each firing or
resolved once) and the alerts still firing. Sinks never raise into the processor: a
failed delivery is logged and counted (``failures``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Protocol

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


class KafkaAlertSink:
    """One JSON message per event on the alerts topic (created when missing)."""

    def __init__(self, settings: Any, topic: str | None = None) -> None:
        from kafka import KafkaProducer

        from gpuledger.pipeline.kafka.producer import producer_config

        self.settings = settings
        self.topic = topic or alerts_topic(settings)
        self.ensure_topic()
        self.producer = KafkaProducer(**producer_config(settings, compression_type=None))
        self.sent = 0
        self.failures = 0

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
        if not events:
            return
        try:
            for alert in events:
                key = "/".join(str(k) for k in alert.key).encode()
                value = json.dumps(alert.message(), default=str).encode()
                self.producer.send(self.topic, key=key, value=value)
            self.producer.flush(timeout=30)
            self.sent += len(events)
        except Exception as exc:  # a broker outage must not stop the processor
            self.failures += len(events)
            log.warning("alerts topic %s: %d event(s) not sent: %s", self.topic, len(events), exc)

    def close(self) -> None:
        self.producer.flush(timeout=30)
        self.producer.close()


def webhook_problem(url: str) -> str | None:
    """Why ``url`` cannot be an Alertmanager endpoint (http or https, a host, a port in
    range), or None."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return str(exc)
    if parts.scheme not in ("http", "https"):
        return "expected an http:// or https:// URL (e.g. http://alertmanager:9093/api/v2/alerts)"
    if not parts.hostname:
        return "no host in the URL"
    if port == 0:
        return "port 0 is not a port"
    return None


class WebhookSink:
    """POSTs Alertmanager-shaped lists (``/api/v2/alerts``) to ``url``.

    Events go out as they happen; alerts still firing are sent again every
    ``resend_s`` seconds (wall clock), as Prometheus does, so that Alertmanager does not
    time them out (its ``resolve_timeout``); Alertmanager de-duplicates notifications.
    """

    def __init__(self, url: str, timeout_s: float = 5.0, resend_s: float = 60.0,
                 generator_url: str | None = None) -> None:
        problem = webhook_problem(url)
        if problem:
            raise ValueError(f"{url!r}: {problem}")
        self.url = url
        self.timeout_s = timeout_s
        self.resend_s = resend_s
        self.generator_url = generator_url
        self.posts = 0
        self.failures = 0
        self._last_send = 0.0

    def publish(self, events: list[Alert], active: list[Alert]) -> None:
        due = time.monotonic() - self._last_send >= self.resend_s
        if due:
            sent = {a.key for a in events}
            events = events + [a for a in active if a.key not in sent]
        if not events:
            return
        self._post([a.alertmanager(self.generator_url) for a in events])

    def _post(self, body: list[dict[str, Any]]) -> None:
        try:
            request = urllib.request.Request(
                self.url, data=json.dumps(body).encode(), method="POST",
                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                reply.read()
            self.posts += 1
            self._last_send = time.monotonic()
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self.failures += 1
            log.warning("alert webhook %s: %s (%d alert event(s) not sent)", self.url, exc,
                        len(body))
