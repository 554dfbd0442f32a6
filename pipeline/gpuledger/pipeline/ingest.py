"""Process recorded events (contract JSON lines) into a warehouse.

Files may hold any mix of record types, in any order. All files are decoded first
(bad lines are collected with file, line and reason), then the events are fed to the
processor in event-time order, exactly as a live stream would arrive: ten minutes to an
hour at a time while there is telemetry (about SLICE_SAMPLES samples a batch; its
samples wait in memory until their minutes close),
a day at a time for a history of scheduler and inventory events alone (the processor
then closes a day per pass and keeps GPUs without telemetry as spans, so a year of
history costs per event, not per GPU-minute). The decoded input is held in memory while
it is fed (about 150 bytes per telemetry sample): split very long histories by day.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl

from gpuledger.contract.schema import RECORD_TYPES, RecordType
from gpuledger.pipeline.checkpoint import CheckpointStore, merge_section
from gpuledger.pipeline.columns import TIME_DTYPE, empty_frame
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.counters import Counters
from gpuledger.pipeline.decode import decode_jsonl_files, encode_jsonl
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.validate import REJECT_SCHEMA, validate
from gpuledger.pipeline.warehouse import Warehouse

log = logging.getLogger(__name__)

SLICE = timedelta(minutes=10)
"""The least event time fed per batch while there is telemetry."""
LONGEST_SLICE = timedelta(hours=1)
"""The most event time fed per batch while there is telemetry."""
SLICE_SAMPLES = 100_000
"""Telemetry samples per batch the slice aims at, between the two. Every batch pays a
close pass (about 0.3 CPU-seconds of fixed cost), so a small cluster's history goes an
hour at a time; the samples of a batch are held while it is processed, so the built-in
cluster (576 GPUs, 10 s) goes about half an hour at a time and a large one ten minutes
at a time, as before (the demo: about 35 user CPU-s and 460 MiB at the peak, against 51
and 390 MiB ten minutes at a time, and 30 and 592 MiB an hour at a time; bench/README.md)."""
HISTORY_SLICE = timedelta(days=1)
"""Event time fed per batch of a history without telemetry."""


def telemetry_slice(samples: int, span: timedelta) -> timedelta:
    """Whole minutes of event time per batch for ``samples`` telemetry samples over
    ``span``: about SLICE_SAMPLES a batch, within SLICE … LONGEST_SLICE."""
    minutes = max(span.total_seconds() / 60, 1.0)
    per_batch = SLICE_SAMPLES / max(samples / minutes, 1.0)
    return timedelta(minutes=int(min(max(per_batch, SLICE.total_seconds() / 60),
                                     LONGEST_SLICE.total_seconds() / 60)))


INGEST_STATE = "state/ingest"
"""Where ``ingest`` keeps its engine's state between runs, in the warehouse."""


@dataclass
class IngestResult:
    """What an ingest did."""

    records: dict[str, int]
    rejects: pl.DataFrame
    counters: Counters
    continued_from: datetime | None = None
    """Where the previous ingest into this warehouse had closed, when this one went on
    from it (its input starting there or later)."""


def ingest_state(processor: Processor) -> CheckpointStore:
    """The checkpoint of ``ingest`` runs into ``processor``'s warehouse."""
    return CheckpointStore(processor.warehouse.store.child(INGEST_STATE), "ingest")


def continue_previous(processor: Processor, state: CheckpointStore,
                      first: datetime) -> datetime | None:
    """Take the previous ingest's engine state (its job and inventory books, open hours,
    usage so far) into ``processor`` when the new input's first event is at or after the
    point it had closed: its jobs go on (a job started then, finished now). Input that
    reaches back before that point is processed afresh, as a re-run (the same files
    write the same facts). Returns the point continued from, or None."""
    try:
        sections = {p: state.read_partition(p) for p in sorted(processor.held)}
    except Exception as exc:  # another release's state, or a damaged file: start afresh
        log.warning("%s: the previous ingest's state cannot be read (%s); processing this "
                    "input afresh", INGEST_STATE, str(exc).splitlines()[0] if str(exc) else
                    type(exc).__name__)
        return None
    closed = [s.closed for s in sections.values() if s is not None and s.closed is not None]
    if not closed or len(closed) < len(sections) or first < max(closed):
        return None
    if state.load_global(processor) is None:
        return None
    for sec in sections.values():
        assert sec is not None
        merge_section(processor, sec)
    processor.counters = Counters()  # this run's own counts
    return max(closed)


def import_history(
    processor: Processor,
    frames: dict[str, pl.DataFrame],
    on_progress: Callable[[float], None] | None = None,
    until: datetime | None = None,
) -> int:
    """An importer's frames (openb, sacct, pods): validate them, keep the rejects, feed
    the rest in event-time order and flush up to ``until`` (a window's end; default the
    newest event). The number of rejected records."""
    good: dict[RecordType, pl.DataFrame] = {}
    rejected = 0
    for kind, frame in frames.items():
        ok, bad = validate(frame, kind, limits=processor.config.limits)  # type: ignore[arg-type]
        processor.add_rejects(bad)
        rejected += bad.height
        good[kind] = ok  # type: ignore[index]
    feed_in_time_order(processor, good, on_progress, until)
    return rejected


def feed_in_time_order(
    processor: Processor,
    frames: dict[RecordType, pl.DataFrame],
    on_progress: Callable[[float], None] | None = None,
    until: datetime | None = None,
) -> None:
    """Feed validated frames to ``processor`` in event-time slices, then flush (every
    minute before ``until`` when given, else up to the newest event)."""
    ordered = {k: f.sort("time", maintain_order=True) for k, f in frames.items()
               if not f.is_empty()}
    if not ordered:
        processor.flush(until)
        return
    first: datetime = min(f["time"][0] for f in ordered.values())
    last: datetime = max(f["time"][-1] for f in ordered.values())
    step = (telemetry_slice(ordered["telemetry"].height, last - first)
            if "telemetry" in ordered else HISTORY_SLICE)
    start = first.replace(second=0, microsecond=0)
    offsets = dict.fromkeys(ordered, 0)
    total = max((last - start).total_seconds(), 1.0)
    while start <= last:
        end = start + step
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
    processor.flush(until)


OUTLIER_MARGIN = timedelta(days=7)
"""The least distance from the bulk of an ingest's event times at which an event is set
aside as an outlier (``set_aside_outliers``)."""


def set_aside_outliers(frames: dict[RecordType, pl.DataFrame], config: ProcessorConfig
                       ) -> tuple[dict[RecordType, pl.DataFrame], pl.DataFrame]:
    """Events far outside the input's own time range are set aside as rejects, with their
    reason: further before its 1st percentile of event times than ``windows.max_behind_s``
    or after its 99th than ``windows.max_ahead_s``, than the input's own span between the
    two, and than :data:`OUTLIER_MARGIN` (a line from a wrong year, a clock months ahead;
    not a job that ends hours after a burst of submissions). They would otherwise make
    the processor walk the empty years between, or close minutes no other event reached."""
    times = pl.concat([f.select("time") for f in frames.values() if not f.is_empty()]) \
        if any(not f.is_empty() for f in frames.values()) else None
    if times is None or times.height < 20:
        return frames, pl.DataFrame(schema=REJECT_SCHEMA)
    lo, hi = times.select(pl.col("time").quantile(0.01, "lower"),
                          pl.col("time").quantile(0.99, "higher").alias("h")).row(0)
    w = config.windows
    margin = max(hi - lo, OUTLIER_MARGIN)
    early = lo - max(timedelta(seconds=w.max_behind_s), margin)
    late = hi + max(timedelta(seconds=w.max_ahead_s), margin)
    fmt = "%Y-%m-%dT%H:%M:%S%.3fZ"
    kept: dict[RecordType, pl.DataFrame] = {}
    out: list[pl.DataFrame] = []
    for kind, frame in frames.items():
        outside = (pl.col("time") < pl.lit(early).cast(TIME_DTYPE)) | (
            pl.col("time") > pl.lit(late).cast(TIME_DTYPE))
        bad = frame.filter(outside)
        kept[kind] = frame.filter(~outside) if not bad.is_empty() else frame
        if bad.is_empty():
            continue
        reason = (pl.lit("field 'time': ") + pl.col("time").dt.strftime(fmt)
                  + pl.lit(f" is far outside the input's time range ({lo:%Y-%m-%dT%H:%MZ}"
                           f" … {hi:%Y-%m-%dT%H:%MZ}, 1st to 99th percentile; "
                           f"windows.max_behind_s {w.max_behind_s}, "
                           f"windows.max_ahead_s {w.max_ahead_s})"))
        out.append(bad.select(
            pl.lit(kind).alias("record_type"), pl.lit("ingest").alias("source"),
            pl.lit(None, pl.Int64).alias("line"), reason.alias("reason"),
            pl.Series("raw", encode_jsonl(bad, kind).decode().splitlines(), pl.String)))
    return kept, pl.concat(out) if out else pl.DataFrame(schema=REJECT_SCHEMA)


def ingest(
    paths: Sequence[Path],
    warehouse: str | Path,
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
    frames, outliers = set_aside_outliers(frames, config)
    if not outliers.is_empty():
        all_rejects = pl.concat([all_rejects, outliers])
    processor = Processor(config, Warehouse(warehouse, options=config.warehouse))
    state = ingest_state(processor)
    times: list[datetime] = [f.select(pl.col("time").min()).item() for f in frames.values()
                             if not f.is_empty()]
    continued = continue_previous(processor, state, min(times)) if times else None
    processor.add_rejects(all_rejects)
    for kind, frame in frames.items():
        processor.counters.records_in[kind] += frame.height
    feed_in_time_order(processor, frames, on_progress)
    state.save(processor, {}, {p: {} for p in processor.held})
    return IngestResult({k: f.height for k, f in frames.items()}, all_rejects,
                        processor.counters, continued)
