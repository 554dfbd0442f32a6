"""Self-metrics and health on a small HTTP endpoint (``/metrics``, ``/healthz``).

Computed at scrape time from the agent's own counters, node_exporter style (one
registry, metrics about the exporter itself):

| metric | type | meaning |
|---|---|---|
| ``gpuledger_agent_info{node,agent,source}`` | gauge | always 1 |
| ``gpuledger_agent_collector_duration_seconds{collector}`` | gauge | last collection's wall time |
| ``gpuledger_agent_collector_success{collector}`` | gauge | 1 when the last collection worked |
| ``gpuledger_agent_collector_errors_total{collector}`` | counter | failed collections |
| ``gpuledger_agent_samples_total`` | counter | telemetry samples spooled |
| ``gpuledger_agent_source_series_skipped_total{reason}`` | counter | untrusted series skipped |
| ``gpuledger_agent_attribution_errors_total{method}`` | counter | failed attribution look-ups |
| ``gpuledger_agent_inventory_published_total`` | counter | inventory records spooled |
| ``gpuledger_agent_spool_bytes`` | gauge | bytes in the spool |
| ``gpuledger_agent_spool_backlog_messages`` | gauge | messages not yet confirmed by Kafka |
| ``gpuledger_agent_spool_dropped_messages_total`` | counter | dropped because the spool was full |
| ``gpuledger_agent_spool_dropped_bytes_total`` | counter | their bytes |
| ``gpuledger_agent_spool_failed_appends_total`` | counter | not stored: a failed write |
| ``gpuledger_agent_sent_messages_total`` | counter | messages Kafka confirmed |
| ``gpuledger_agent_send_errors_total`` | counter | failed deliveries (kept in the spool) |
| ``gpuledger_agent_set_aside_messages_total`` | counter | refused by Kafka for their size |
| ``gpuledger_agent_last_send_success_timestamp_seconds`` | gauge | Unix time of the last delivery |

``/healthz`` answers 200 while collections keep completing (the last one less than
``max(3 × interval, 30 s)`` ago and successful), else 503; the body says why. A Kafka
outage alone does not make the agent unhealthy: the spool is there for that.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuledger.agent.http_server import BoundedHTTPServer

if TYPE_CHECKING:
    from gpuledger.agent.run import Agent


class AgentCollector(Collector):
    """Reads the agent's state at scrape time."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Any]:
        a = self.agent
        info = GaugeMetricFamily("gpuledger_agent_info", "The agent's identity.",
                                 labels=["node", "agent", "source"])
        info.add_metric([a.node, a.agent_id, a.source_name], 1)
        yield info
        duration = GaugeMetricFamily("gpuledger_agent_collector_duration_seconds",
                                     "Wall time of the last collection.", labels=["collector"])
        success = GaugeMetricFamily("gpuledger_agent_collector_success",
                                    "1 when the last collection succeeded.",
                                    labels=["collector"])
        errors = CounterMetricFamily("gpuledger_agent_collector_errors",
                                     "Failed collections.", labels=["collector"])
        duration.add_metric([a.source_name], a.last_duration_s)
        success.add_metric([a.source_name], 1 if a.last_success else 0)
        errors.add_metric([a.source_name], a.collect_errors)
        yield from (duration, success, errors)
        yield CounterMetricFamily("gpuledger_agent_samples", "Telemetry samples spooled.",
                                  value=a.samples)
        skipped = CounterMetricFamily("gpuledger_agent_source_series_skipped",
                                      "Series of the source skipped as untrustworthy, by "
                                      "reason (never turned into GPUs).", labels=["reason"])
        counts = dict(getattr(a.source, "skipped", {}))
        if a.inconsistent_memory:
            counts["inconsistent_memory"] = a.inconsistent_memory
        for reason, count in sorted(counts.items()):
            skipped.add_metric([reason], count)
        yield skipped
        attribution = CounterMetricFamily("gpuledger_agent_attribution_errors",
                                          "Failed attribution look-ups.", labels=["method"])
        for method in a.chain.methods:
            attribution.add_metric([method.name], method.errors)
        yield attribution
        yield CounterMetricFamily("gpuledger_agent_inventory_published",
                                  "Inventory records spooled.", value=a.publisher.published)
        spool = a.spool
        if spool is not None:
            yield GaugeMetricFamily("gpuledger_agent_spool_bytes", "Bytes in the spool.",
                                    value=spool.bytes_used)
            yield GaugeMetricFamily("gpuledger_agent_spool_backlog_messages",
                                    "Messages not yet confirmed by Kafka.",
                                    value=spool.backlog)
            yield CounterMetricFamily("gpuledger_agent_spool_dropped_messages",
                                      "Messages dropped because the spool was full.",
                                      value=spool.dropped_messages)
            yield CounterMetricFamily("gpuledger_agent_spool_dropped_bytes",
                                      "Bytes of the messages dropped.",
                                      value=spool.dropped_bytes)
            yield CounterMetricFamily("gpuledger_agent_spool_failed_appends",
                                      "Messages not stored because the write failed "
                                      "(a full disk).", value=spool.failed_appends)
        sender = a.sender
        if sender is not None:
            yield CounterMetricFamily("gpuledger_agent_sent_messages",
                                      "Messages Kafka confirmed.", value=sender.sent)
            yield CounterMetricFamily("gpuledger_agent_send_errors",
                                      "Failed deliveries (the messages stay spooled).",
                                      value=sender.errors)
            yield CounterMetricFamily("gpuledger_agent_set_aside_messages",
                                      "Messages Kafka refused for their size (kept in "
                                      "set-aside/ of the spool, not sent).",
                                      value=sender.set_aside)
            if sender.last_success is not None:
                yield GaugeMetricFamily("gpuledger_agent_last_send_success_timestamp_seconds",
                                        "Unix time of the last confirmed delivery.",
                                        value=sender.last_success)


def registry_for(agent: Agent) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(AgentCollector(agent))
    return registry


class MetricsServer:
    """``/metrics`` and ``/healthz`` on a background thread (a bounded server:
    :mod:`gpuledger.agent.http_server`)."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry,
                 health: Callable[[], tuple[bool, str]]) -> None:
        def metrics() -> tuple[int, bytes, str]:
            return 200, generate_latest(registry), CONTENT_TYPE_LATEST

        def healthz() -> tuple[int, bytes, str]:
            ok, text = health()
            return (200 if ok else 503), text.encode() + b"\n", "text/plain; charset=utf-8"

        self.httpd = BoundedHTTPServer((host, port), {"/metrics": metrics,
                                                      "/healthz": healthz}).start()
        self.port = self.httpd.port

    def close(self) -> None:
        self.httpd.close()
