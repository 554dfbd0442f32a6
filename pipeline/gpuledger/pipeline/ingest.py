"""Process recorded events (contract JSON lines) into a warehouse.

Files may hold any mix of record types, in any order. All files are decoded first
(bad lines are collected with file, line and reason), then the events are fed to the
processor in event-time order, ten minutes at a time, exactly as a live stream would
arrive. The decoded input is held in memory while it is fed (about 150 bytes per
telemetry sample): split very long histories by day.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl

from gpuledger.contract.schema import RECORD_TYPES, RecordType
from gpuledger.pipeline.columns import empty_frame
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.counters import Counters
from gpuledger.pipeline.decode import decode_jsonl_files
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.validate import REJECT_SCHEMA, validate
from gpuledger.pipeline.warehouse import Warehouse

SLICE = timedelta(minutes=10)


@dataclass
class IngestResult:
    """What an ingest did."""

    records: dict[str, int]
    rejects: pl.DataFrame
    counters: Counters


def import_history(
    processor: Processor,
    frames: dict[str, pl.DataFrame],
    on_progress: Callable[[float], None] | None = None,
) -> int:
    """An importer's frames (openb, sacct, pods): validate them, keep the rejects, feed
    the rest in event-time order and flush. The number of rejected records."""
    good: dict[RecordType, pl.DataFrame] = {}
    rejected = 0
    for kind, frame in frames.items():
        ok, bad = validate(frame, kind, limits=processor.config.limits)  # type: ignore[arg-type]
        processor.add_rejects(bad)
        rejected += bad.height
        good[kind] = ok  # type: ignore[index]
    feed_in_time_order(processor, good, on_progress)
    return rejected


def feed_in_time_order(
    processor: Processor,
    frames: dict[RecordType, pl.DataFrame],
    on_progress: Callable[[float], None] | None = None,
) -> None:
    """Feed validated frames to ``processor`` in event-time slices, then flush."""
    ordered = {k: f.sort("time", maintain_order=True) for k, f in frames.items()
               if not f.is_empty()}
    if not ordered:
        processor.flush()
        return
    first: datetime = min(f["time"][0] for f in ordered.values())
    last: datetime = max(f["time"][-1] for f in ordered.values())
    start = first.replace(second=0, microsecond=0)
    offsets = dict.fromkeys(ordered, 0)
    total = max((last - start).total_seconds(), 1.0)
    while start <= last:
        end = start + SLICE
        batch: dict[str, pl.DataFrame] = {}
        for kind, frame in ordered.items():
            stop = int(frame["time"].search_sorted(end, side="left"))
            if stop > offsets[kind]:
                batch[kind] = frame.slice(offsets[kind], stop - offsets[kind])
                offsets[kind] = stop
        processor.process(batch, validated=True)
        start = end
        if on_progress is not None:
            on_progress(min((start - first).total_seconds() / total, 1.0))
    processor.flush()


def ingest(
    paths: Sequence[Path],
    warehouse: Path,
    config: ProcessorConfig,
    on_progress: Callable[[float], None] | None = None,
) -> IngestResult:
    """Decode ``paths`` and process them into ``warehouse``."""
    parts: dict[RecordType, list[pl.DataFrame]] = {k: [] for k in RECORD_TYPES}
    rejects: list[pl.DataFrame] = []
    for decoded in decode_jsonl_files(list(paths), max_future_s=config.windows.max_future_s,
                                      limits=config.limits):
        for kind in RECORD_TYPES:
            frame = decoded.frames[kind]
            if not frame.is_empty():
                parts[kind].append(frame)
        if not decoded.rejects.is_empty():
            rejects.append(decoded.rejects)
    frames: dict[RecordType, pl.DataFrame] = {
        k: pl.concat(v) if v else empty_frame(k) for k, v in parts.items()
    }
    all_rejects = pl.concat(rejects) if rejects else pl.DataFrame(schema=REJECT_SCHEMA)
    processor = Processor(config, Warehouse(warehouse))
    processor.add_rejects(all_rejects)
    for kind, frame in frames.items():
        processor.counters.records_in[kind] += frame.height
    feed_in_time_order(processor, frames, on_progress)
    return IngestResult({k: f.height for k, f in frames.items()}, all_rejects,
                        processor.counters)
