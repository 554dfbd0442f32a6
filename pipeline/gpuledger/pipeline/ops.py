"""The ops surface around a running processor: ``/metrics`` and the alert engine.

``gpuledger demo`` and ``gpuledger process`` build one :class:`OpsSurface` from their
``--metrics-address``, ``--alert-webhook`` and (process) alerts-topic options and hand it
the processor, or the Kafka service whose engine it then follows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuledger.pipeline.alerts.engine import AlertEngine
from gpuledger.pipeline.alerts.sinks import AlertSink, KafkaAlertSink, TallySink, WebhookSink
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.exporter import Exporter, parse_address
from gpuledger.pipeline.exporter.service import follow_engine

if TYPE_CHECKING:
    from gpuledger.pipeline.processor import Processor


class OpsSurface:
    """Exporter and alert engine, each optional."""

    def __init__(self, config: ProcessorConfig, metrics_address: str | None = None,
                 alert_webhook: str | None = None, kafka_settings: Any = None,
                 alerts: bool = False) -> None:
        """``alerts``: run the alert engine even without a webhook or Kafka (the alerts
        fired are counted in ``tally``)."""
        self.address = parse_address(metrics_address) if metrics_address else None
        self.exporter = Exporter(config) if self.address else None
        self.tally = TallySink()
        sinks: list[AlertSink] = [self.tally]
        self.kafka_sink: KafkaAlertSink | None = None
        self.webhook: WebhookSink | None = None
        if alert_webhook:
            self.webhook = WebhookSink(alert_webhook)
            sinks.append(self.webhook)
        if kafka_settings is not None:
            self.kafka_sink = KafkaAlertSink(kafka_settings)
            sinks.append(self.kafka_sink)
        self.engine = AlertEngine(config, sinks) if alerts or len(sinks) > 1 else None
        self.port: int | None = None

    def follow(self, processor: Processor) -> None:
        if self.exporter is not None:
            self.exporter.attach(processor)
        if self.engine is not None:
            self.engine.attach(processor)

    def unfollow(self, processor: Processor) -> None:
        if self.exporter is not None:
            self.exporter.detach(processor)
        if self.engine is not None:
            self.engine.detach(processor)

    def follow_service(self, service: Any) -> None:
        """Follow a Kafka service's engine (and its consumer lag)."""
        follow_engine(service, self.follow)
        if self.exporter is not None:
            self.exporter.health.service = service

    def start(self) -> str | None:
        """Start serving ``/metrics``; its URL, or None without an address."""
        if self.exporter is None or self.address is None:
            return None
        host, port = self.address
        self.port = self.exporter.start(host, port)
        return f"http://{host}:{self.port}/metrics"

    def deliver(self, timeout_s: float = 10.0) -> None:
        """The end of alerting: the webhook's queued alerts get up to ``timeout_s`` to go
        out, then what is left is given up (counted, so the summary says it)."""
        if self.webhook is not None:
            self.webhook.close(timeout_s)

    def summary(self) -> str | None:
        if self.engine is None:
            return None
        kinds = self.tally.fired
        detail = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        text = (f"alerts: {sum(kinds.values())} fired ({detail or 'none'}), "
                f"{len(self.engine.firing)} still firing")
        hook = self.webhook
        if hook is not None:
            text += (f"; webhook: {hook.delivered} event(s) delivered in {hook.posts} "
                     f"POST(s), {hook.failures} failed POST(s), {hook.dropped} event(s) "
                     "given up")
        return text

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop serving and alerting; the webhook's queue gets up to ``timeout_s`` (0 on
        an interrupt: what is left is counted and logged, not waited for)."""
        if self.exporter is not None:
            self.exporter.stop()
        if self.webhook is not None:
            self.webhook.close(timeout_s)
        if self.kafka_sink is not None:
            self.kafka_sink.close()
