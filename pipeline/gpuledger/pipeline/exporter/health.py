"""The pipeline's own health: counters, event clocks, Kafka consumer lag."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import GaugeMetricFamily, Metric

from gpuledger.pipeline.counters import Counters
from gpuledger.pipeline.exporter.families import counter

if TYPE_CHECKING:
    from gpuledger.pipeline.processor import Processor


class HealthCollector:
    """Reads the processor's :class:`~gpuledger.pipeline.counters.Counters` and clocks
    (and the Kafka service's, when there is one) at scrape time."""

    name = "health"

    def __init__(self) -> None:
        self.processors: list[Processor] = []
        self.service: Any = None
        self._lag = 0.0

    def collect(self) -> Iterator[Metric]:
        procs = list(self.processors)
        if not procs:
            return
        c = Counters.total([p.counters for p in procs])
        yield counter("gpuledger_records", "Records received, by record type.",
                      dict(c.records_in), "record_type")
        yield counter("gpuledger_rejected_records",
                      "Records rejected, by record type, each with its reason in the rejects "
                      "table (only undecodable ones also go to the dead-letter topic).",
                      dict(c.rejected),
                      "record_type")
        yield counter("gpuledger_late_events",
                      "Events that arrived after their minute had closed, by record type.",
                      {"telemetry": c.late_telemetry, "job": c.late_job_events,
                       "inventory": c.late_inventory}, "record_type")
        yield counter("gpuledger_duplicate_events", "Duplicated events counted once.",
                      {"telemetry": c.duplicate_samples, "job": c.duplicate_job_events},
                      "record_type")
        yield counter("gpuledger_out_of_order_job_events",
                      "Job events that did not fit the job life cycle.",
                      c.out_of_order_job_events)
        yield counter("gpuledger_telemetry_lost_samples",
                      "Telemetry samples missing from agents' sequence numbers.",
                      c.telemetry_lost_samples)
        yield counter("gpuledger_overcommitted_gpu_seconds",
                      "GPU-time (GPU-seconds, in whole minutes) whose allocations summed to "
                      "more than the whole GPU (jobs given the same GPU at once; it counts "
                      "as allocated once).", 60 * c.overcommitted_gpu_minutes)
        yield counter("gpuledger_uncharged_allocation_gpu_seconds",
                      "Allocated GPU-time (GPU-seconds) on GPUs no inventory knew at the time "
                      "(an unknown node or GPU index): not charged.",
                      c.uncharged_allocation_ms / 1000)
        yield counter("gpuledger_late_job_allocation_gpu_seconds",
                      "Allocated GPU-time (GPU-seconds) closed minutes got wrong because job "
                      "events arrived after they closed: charged after attempts ended, or "
                      "not charged before they started.",
                      {"charged_after_end": c.late_overcharged_ms / 1000,
                       "uncharged_before_start": c.late_undercharged_ms / 1000}, "error")
        yield counter("gpuledger_closed_windows", "One-minute windows closed.", c.minutes_closed)
        yield counter("gpuledger_close_passes", "Passes that closed one or more minutes.",
                      c.close_passes)
        yield counter("gpuledger_fact_rows", "Fact rows written, by table.",
                      dict(c.fact_rows), "table")
        yield counter("gpuledger_batches", "Micro-batches processed.", c.batches)
        last = GaugeMetricFamily("gpuledger_last_event_timestamp_seconds",
                                 "Newest event time seen (Unix seconds), by stream "
                                 "(telemetry; scheduler = job and inventory events).",
                                 labels=["stream"])
        for stream, attr in (("telemetry", "max_telemetry_time"), ("scheduler", "max_other_time")):
            times = [t for t in (getattr(p, attr) for p in procs) if t is not None]
            if times:
                last.add_metric([stream], max(times).timestamp())
        yield last
        closed = GaugeMetricFamily("gpuledger_closed_until_timestamp_seconds",
                                   "End of the latest minute closed by every shard (event "
                                   "time, Unix seconds).")
        until = [p.closed_until for p in procs if p.closed_until is not None]
        if until:  # shards without telemetry yet have nothing to close
            closed.add_metric([], min(until).timestamp())
        yield closed
        if self.service is not None:
            yield from self._kafka()

    def _kafka(self) -> Iterator[Metric]:
        s = self.service
        yield counter("gpuledger_kafka_messages", "Kafka messages consumed.", s.stats.messages)
        yield counter("gpuledger_kafka_dead_letters",
                      "Bad Kafka records sent to the dead-letter topic.", s.stats.dead_letters)
        yield counter("gpuledger_kafka_checkpoints", "Checkpoints written (state + offsets).",
                      s.stats.checkpoints)
        try:  # read from the client's local fetch state; a rebalance may be under way
            lag = 0.0
            for tp in list(s.telemetry.assignment()):
                high = s.telemetry.highwater(tp)
                if high is not None:
                    lag += max(high - s.offsets.get((tp.topic, tp.partition), 0), 0)
            self._lag = lag
        except (RuntimeError, KeyError, AttributeError):
            pass
        yield GaugeMetricFamily("gpuledger_kafka_consumer_lag_messages",
                                "Telemetry messages in this instance's partitions not yet read.",
                                value=self._lag)
