"""The Prometheus exporter: ``/metrics`` from the processor's latest closed minute."""

from gpuledger.pipeline.exporter.server import Exporter, parse_address

__all__ = ["Exporter", "parse_address"]
