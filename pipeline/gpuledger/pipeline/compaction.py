"""Compaction: closed days of hourly parts become one object per table, unit and day.

Hourly parts × partitions grow into tens of thousands of objects a month; a reader opens
every one of them. Once a day is closed (the processor has closed
``warehouse.compact_after_s`` past its end), its hourly parts of a table are rewritten
into the day's object (the daily name, ``<table>-YYYY-MM-DD[-pNNN]``) and the hourly
names leave the manifest in the same commit: readers see the day in hours or in one
object, never both, never neither. ``gpu_minute``'s day is sorted by job, then minute,
so that one job's minutes (the job board's timelines) sit in a few row groups that
DuckDB finds from their statistics (``gpu_span``, the spans of GPUs without telemetry,
too); the other tables keep their sort order, which
starts with time.

An hour written again into a compacted day (late rows, a replay after a restart) goes
into the day's object (``Warehouse.write_part``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from gpuledger.pipeline.generations import OBJECT_NAME, Manifest, retired_objects
from gpuledger.pipeline.store import Store
from gpuledger.pipeline.tables import SORT_KEYS

PART_TIME: dict[str, str] = {
    "gpu_minute": "minute", "gpu_span": "minute", "job_gpu": "ended_at", "frag_minute": "minute",
    "pending_minute": "minute", "blocked_minute": "minute", "job_attempts": "ended_at",
    "preemptions": "time", "recommendations": "ended_at", "gpu_hourly": "hour",
    "late_telemetry": "minute",
}
"""The column that puts a row of each hourly table into its hour's part (the processor
buffers rows by the hour of this column)."""

COMPACT_SORT: dict[str, list[str]] = {
    "gpu_minute": ["job_id", "minute", "node", "gpu_index"],
    "gpu_span": ["job_id", "minute", "node", "gpu_index"],
}
ROW_GROUP_ROWS = 65_536
"""Row groups of compacted objects: small enough for a job's rows to be found by their
statistics, large enough to scan well."""

_HOURLY = re.compile(r"^facts/([a-z_]+)/date=(\d{4}-\d{2}-\d{2})/[a-z_]+-\d{4}-\d{2}-\d{2}T\d{2}"
                     r"(-p\d{3})?\.parquet$")


_STAMP = re.compile(r"-(\d{4}-\d{2}-\d{2})(?:T(\d{2}))?(?:-p\d{3})?\.parquet$")


def part_span(logical: str) -> tuple[datetime, datetime] | None:
    """The time a part's logical name covers: its hour (``…-2026-01-05T03.parquet``) or
    its day (a compacted day, a day-partitioned table); None for other files."""
    match = _STAMP.search(logical)
    if match is None:
        return None
    start = datetime.strptime(match.group(1), "%Y-%m-%d").replace(tzinfo=UTC)
    if match.group(2) is None:
        return start, start + timedelta(days=1)
    start += timedelta(hours=int(match.group(2)))
    return start, start + timedelta(hours=1)


def sort_order(table: str, sort_by: list[str] | None) -> list[str]:
    return COMPACT_SORT.get(table) or sort_by or SORT_KEYS[table]


def days_to_compact(manifest: Manifest, before: datetime) -> dict[tuple[str, datetime],
                                                                    list[str]]:
    """(table, day) → the day's hourly parts, for days that end at or before ``before``."""
    out: dict[tuple[str, datetime], list[str]] = {}
    for logical in manifest.files:
        match = _HOURLY.match(logical)
        if match is None or match.group(1) not in PART_TIME:
            continue
        day = datetime.strptime(match.group(2), "%Y-%m-%d").replace(tzinfo=UTC)
        if day + timedelta(days=1) <= before:
            out.setdefault((match.group(1), day), []).append(logical)
    return {k: sorted(v) for k, v in out.items()}


def newest_hour(manifests: Iterable[Manifest]) -> datetime | None:
    """The newest hour any hourly part of ``manifests`` covers (its end)."""
    newest: datetime | None = None
    for manifest in manifests:
        for logical in manifest.files:
            span = part_span(logical)
            if span is None or span[1] - span[0] != timedelta(hours=1):
                continue
            newest = span[1] if newest is None or span[1] > newest else newest
    return newest


def orphans(store: Store, manifests: Iterable[Manifest], older_than: float,
            retired: set[str] | None = None) -> list[str]:
    """Fact objects that no manifest names and no retired log lists (``retired``, when
    the caller has read them), written before ``older_than`` (Unix seconds): uploads a
    crash cut off before their commit. Only names gpuledger gives its objects
    (``….<digest>.parquet``) count: a file of someone else's under ``facts/`` is left
    alone."""
    manifests = list(manifests)
    named = set(retired_objects(store, manifests) if retired is None else retired)
    for manifest in manifests:
        named.update(manifest.files.values())
    return sorted(e.path for e in store.list("facts")
                  if OBJECT_NAME.search(e.path) and e.path not in named
                  and e.mtime < older_than)
