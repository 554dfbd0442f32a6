"""The demo: simulate a cluster, stream it over the embedded bus, build the warehouse."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuledger.cli.errors import CliError
from gpuledger.pipeline.bus import EmbeddedBus, marking_last
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.counters import Counters
from gpuledger.pipeline.generations import read_snapshot
from gpuledger.pipeline.ingest import LONGEST_SLICE, SLICE_SAMPLES
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.simulate import SimConfig, simulate
from gpuledger.pipeline.store import Store, StoreError, open_store
from gpuledger.pipeline.warehouse import Warehouse

DEMO_MARK = "state/demo.json"
"""In a warehouse a demo wrote (at its start): the next demo may write there too."""


class DemoRefused(CliError):
    """A warehouse the demo must not write its simulated facts into (one line)."""


def check_for_demo(location: str | Path) -> Store | None:
    """The demo writes simulated jobs and GPUs: into an empty warehouse (None), or one a
    demo wrote (its store, for :func:`clear_demo`). A warehouse holding other facts
    (ingested, imported, the Kafka service's) is refused, in one line, before anything
    is written: the simulated facts went in beside them (another day) or replaced them
    (the same day), with exit status 0. Reads only (a location that does not exist yet
    is empty)."""
    try:
        store = open_store(location, create=False)
        if store.exists(DEMO_MARK):
            return store
        snapshot = read_snapshot(store)
    except FileNotFoundError:
        return None
    tables = sorted(t for t, files in snapshot.files.items() if files)
    if not tables:
        return None
    raise DemoRefused(
        f"{store.url}: holds facts the demo did not write ({', '.join(tables[:3])}"
        f"{', …' if len(tables) > 3 else ''}): the demo writes a simulated cluster's "
        "facts, which would go in beside them or replace them. Give it a warehouse "
        "of its own (--warehouse demo-warehouse); a demo of an earlier release left no "
        f"mark ({DEMO_MARK}): delete that warehouse to run the demo into it again")


def clear_demo(store: Store) -> int:
    """Delete what an earlier demo wrote in ``store`` (its mark last, so that a clear
    cut short is done again by the next demo); the number of files deleted. A second
    demo replaced only the hours it simulated: a 2 h demo, then a 0.5 h one, left the
    first run's second hour and its ended jobs beside the new run, and the summary the
    demo printed added them up."""
    entries = [e.path for e in store.list("") if e.path != DEMO_MARK]
    for path in entries:
        store.delete(path)
    store.delete(DEMO_MARK)
    return len(entries)


def check_not_demo(location: str | Path) -> None:
    """The other way round: a warehouse a demo wrote (:data:`DEMO_MARK`) holds a
    simulated cluster's jobs and GPUs; ingesting, importing or processing real facts into
    it is refused, in one line, before anything is written. Before, only the same hours
    were refused: another day's real facts went in beside the simulated ones in silence
    (the demo, ingest and the imports all default to ./warehouse). Reads only."""
    try:
        store = open_store(location, create=False)
        marked = store.exists(DEMO_MARK)
    except (OSError, StoreError):  # missing, unreachable, credentials refused: the
        return  # command opens it and says why, in one line
    if marked:
        raise DemoRefused(
            f"{store.url}: is a demo's warehouse (a simulated cluster's facts; "
            f"{DEMO_MARK}): real facts would go in beside them. Give this input a "
            "warehouse of its own (--warehouse PATH), or delete the demo's first")


def mark_demo(store: Store) -> None:
    """Mark ``store`` as a demo's, before the demo writes facts into it (a demo stopped
    part way is run again there)."""
    store.write(DEMO_MARK, json.dumps({"demo": True}).encode())


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
    mark_demo(processor.warehouse.store)
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
