"""The exporter: one registry, the collectors, the HTTP server.

Usage (the CLI's ``--metrics-address``)::

    exporter = Exporter(config)
    exporter.attach(processor)            # listens to its closed facts, reads its counters
    exporter.start("0.0.0.0", 9108)       # GET /metrics, /healthz
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuledger.agent.http_server import BoundedHTTPServer
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.exporter.demand import DemandCollector
from gpuledger.pipeline.exporter.fleet import FleetCollector
from gpuledger.pipeline.exporter.health import HealthCollector
from gpuledger.pipeline.exporter.histogram import Histogram
from gpuledger.pipeline.exporter.jobs import JobCollector
from gpuledger.pipeline.exporter.nodes import NodeCollector
from gpuledger.pipeline.exporter.snapshot import (
    QUEUE_LABELS,
    QUEUE_WAIT_BUCKETS,
    FactSnapshots,
    Snapshot,
    merge,
)

if TYPE_CHECKING:
    from gpuledger.pipeline.processor import Processor

DEFAULT_PORT = 9108


class AddressError(ValueError):
    """A ``HOST:PORT`` that is not one."""


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``:PORT`` means all interfaces) → (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise AddressError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:{DEFAULT_PORT}")
    return (host.strip("[]") or "0.0.0.0"), int(port)


class _Collector(Collector):
    """Runs every fact collector on the current snapshot, timing each (node_exporter's
    ``*_collector_duration_seconds`` / ``*_collector_success``)."""

    def __init__(self, exporter: Exporter) -> None:
        self.exporter = exporter

    def collect(self) -> Iterator[Metric]:
        ex = self.exporter
        snap = ex.snapshot()
        duration = GaugeMetricFamily("gpuledger_exporter_collect_duration_seconds",
                                     "Seconds each collector took for this scrape.",
                                     labels=["collector"])
        success = GaugeMetricFamily("gpuledger_exporter_collect_success",
                                    "1 when the collector succeeded in this scrape.",
                                    labels=["collector"])
        runs: list[tuple[str, Any]] = [(c.name, lambda c=c: c.collect(snap))
                                       for c in ex.collectors]
        runs.append((ex.health.name, ex.health.collect))
        for name, run in runs:
            t0 = time.perf_counter()
            try:
                metrics = list(run())
                ok = 1.0
            except Exception:  # a broken collector must not break the whole scrape
                ex.log_failure(name)
                metrics, ok = [], 0.0
            yield from metrics
            duration.add_metric([name], time.perf_counter() - t0)
            success.add_metric([name], ok)
        yield duration
        yield success


class Exporter:
    """Prometheus metrics from a processor's closed facts, computed at scrape time."""

    def __init__(self, config: ProcessorConfig) -> None:
        self.queue_wait = Histogram(QUEUE_LABELS, QUEUE_WAIT_BUCKETS)
        self.lock = threading.Lock()
        self.sources: dict[int, tuple[Processor, FactSnapshots]] = {}
        self.health = HealthCollector()
        self.collectors: list[Any] = [
            FleetCollector(),
            DemandCollector(self.queue_wait, self.lock),
            JobCollector(config),
            NodeCollector(),
        ]
        self.registry = CollectorRegistry()
        self.registry.register(_Collector(self))
        ProcessCollector(registry=self.registry)
        self._server: BoundedHTTPServer | None = None

    def attach(self, processor: Processor, service: Any = None) -> FactSnapshots:
        """Follow ``processor``'s closed facts (call it for each shard of a Kafka service);
        ``service``: the Kafka service, if any (its consumer lag and counters)."""
        snaps = FactSnapshots(self.queue_wait, self.lock,
                              observe_waits=bool(getattr(processor, "cluster", True)))
        processor.listeners.append(snaps)
        with self.lock:
            self.sources[id(processor)] = (processor, snaps)
            self.health.processors = [p for p, _ in self.sources.values()]
        if service is not None:
            self.health.service = service
        return snaps

    def detach(self, processor: Processor) -> None:
        """Stop following ``processor`` (a shard this instance no longer runs)."""
        with self.lock:
            found = self.sources.pop(id(processor), None)
            self.health.processors = [p for p, _ in self.sources.values()]
        if found is not None and found[1] in processor.listeners:
            processor.listeners.remove(found[1])

    def snapshot(self) -> Snapshot:
        """The latest closed minute over every processor followed."""
        with self.lock:
            snaps = [s.snapshot for _, s in self.sources.values()]
        return merge(snaps)

    def render(self) -> bytes:
        """The exposition text, as a scrape would get it."""
        return generate_latest(self.registry)

    def start(self, host: str, port: int) -> int:
        """Serve ``/metrics`` (and ``/healthz``) on ``host:port`` in a daemon thread, with
        the bounds of :mod:`gpuledger.agent.http_server` (timeouts, a connection limit,
        404 elsewhere); the bound port."""
        def metrics() -> tuple[int, bytes, str]:
            return 200, self.render(), CONTENT_TYPE_LATEST

        def healthz() -> tuple[int, bytes, str]:
            return 200, b"ok\n", "text/plain; charset=utf-8"

        self._server = BoundedHTTPServer((host, port), {"/metrics": metrics,
                                                        "/healthz": healthz}).start()
        return self._server.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    @staticmethod
    def log_failure(name: str) -> None:
        import logging

        logging.getLogger("gpuledger.exporter").exception("collector %s failed", name)
