"""``gpuledger demo --kafka``: the demo through a real Kafka cluster."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.demo import DemoResult, mark_demo
from gpuledger.pipeline.kafka.producer import KafkaSink
from gpuledger.pipeline.kafka.service import KafkaProcessorService, ServiceOptions
from gpuledger.pipeline.kafka.settings import KafkaSettings
from gpuledger.pipeline.kafka.topics import create_topics
from gpuledger.pipeline.simulate import SimConfig, simulate
from gpuledger.pipeline.store import open_store


def run_kafka_demo(
    sim: SimConfig, config: ProcessorConfig, warehouse: str | Path, settings: KafkaSettings,
    on_progress: Callable[[float], None] | None = None, group_id: str = "gpuledger-demo",
) -> DemoResult:
    """Publish the simulation to Kafka, then process it into ``warehouse``."""
    create_topics(settings)
    sink = KafkaSink(settings)
    total = sim.hours * 60
    done = 0.0
    try:
        for batch in simulate(sim):
            sink.publish_batch(batch)
            done += sim.chunk_minutes
            if on_progress is not None:
                on_progress(0.5 * min(done / total, 1.0))
    finally:
        sink.close()
    mark_demo(open_store(warehouse))
    service = KafkaProcessorService(settings, config, warehouse,
                                    ServiceOptions(group_id=group_id, exit_when_idle_s=3.0))
    try:
        service.run()
    finally:
        service.close()
    if on_progress is not None:
        on_progress(1.0)
    return DemoResult(service.counters(), sink.bytes)
