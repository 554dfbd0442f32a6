"""The demo: simulate a cluster, stream it over the embedded bus, build the warehouse."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuledger.pipeline.bus import EmbeddedBus, marking_last
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.counters import Counters
from gpuledger.pipeline.ingest import LONGEST_SLICE, SLICE_SAMPLES
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.simulate import SimConfig, simulate
from gpuledger.pipeline.warehouse import Warehouse


@dataclass
class DemoResult:
    """Counts from a demo run."""

    counters: Counters
    bus_bytes: int


def run_demo(
    sim: SimConfig,
    config: ProcessorConfig,
    warehouse: str | Path,
    on_progress: Callable[[float], None] | None = None,
    on_processor: Callable[[Processor], None] | None = None,
) -> DemoResult:
    """Simulate ``sim`` and process it through the embedded bus into ``warehouse``.

    ``on_processor`` sees the processor before any input (to attach fact listeners)."""
    bus = EmbeddedBus()
    processor = Processor(config, Warehouse(warehouse, options=config.warehouse))
    if on_processor is not None:
        on_processor(processor)
    total_minutes = sim.hours * 60
    done = 0.0
    pending_minutes, pending_samples = 0, 0

    def drain(last: bool = False) -> None:
        """Hand the bus's batches to the processor; ``last``: the end of the input
        follows, which closes the last batch's minutes (one close pass, not two)."""
        bus.end_batch()
        for consumed, final in marking_last(bus.batches()):
            processor.process(consumed, close=not (last and final))
            bus.commit()

    for batch in simulate(sim):
        # the simulator's chunks go out as they come; a micro-batch ends (and the
        # processor takes it, one close pass) at about SLICE_SAMPLES samples or an
        # hour, as ingest feeds a recorded history
        bus.publish_batch(batch, end=False)
        pending_minutes += sim.chunk_minutes
        pending_samples += batch["telemetry"].height if "telemetry" in batch else 0
        done += sim.chunk_minutes
        if (pending_samples >= SLICE_SAMPLES or done >= total_minutes
                or pending_minutes * 60 >= LONGEST_SLICE.total_seconds()):
            drain(last=done >= total_minutes)
            pending_minutes, pending_samples = 0, 0
        if on_progress is not None:
            on_progress(min(done / total_minutes, 1.0))
    drain(last=True)  # whatever a simulator past its hours left
    processor.flush()
    return DemoResult(processor.counters, bus.published_bytes)
