"""Run every section's SQL on the warehouse (one read-only connection), and find the
time span the data really covers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb

from gpuledger.pipeline import query
from gpuledger.pipeline.analyst_report.numbers import number, when
from gpuledger.pipeline.analyst_report.sections import SECTIONS, Section, bucket_minutes, fill

MAX_ROWS = 100
"""The most rows a long table reads (the first ``top`` shown, the rest folded)."""

NO_ROWS = "no rows in this window"
"""What a section with no rows shows in place of its table (terminal and HTML) when a
window was asked for (:func:`no_rows`)."""


def no_rows(section: Section, window: Window) -> str:
    """What an empty section says: :data:`NO_ROWS` when a window was asked for and the
    section keeps to it, else "no rows" (a warehouse of inventory alone said "in this
    window" with no window asked for)."""
    return NO_ROWS if window.narrowed and section.windowed else "no rows"


@dataclass(frozen=True)
class Window:
    """The data's span (first minute to the end of the last) and the requested window."""

    data_start: datetime | None
    data_end: datetime | None
    since: datetime | None = None
    until: datetime | None = None
    asked_since: datetime | None = None
    asked_until: datetime | None = None
    """What --since/--until said, when the window was widened to whole hours."""

    @property
    def start(self) -> datetime | None:
        times = [t for t in (self.data_start, self.since) if t is not None]
        return max(times) if times else None

    @property
    def end(self) -> datetime | None:
        times = [t for t in (self.data_end, self.until) if t is not None]
        return min(times) if times else None

    @property
    def bucket_minutes(self) -> int:
        """The time charts' bucket (``sections.CHART_BUCKETS``): 5 minutes up to 3 hours
        of data, 15 up to 12 hours, an hour up to 3 days, a day beyond."""
        start, end = self.start, self.end
        return bucket_minutes(end - start if start is not None and end is not None else None)

    @property
    def narrowed(self) -> bool:
        return self.since is not None or self.until is not None

    def asked(self) -> str | None:
        """The --since/--until window, when one was asked for."""
        if not self.narrowed:
            return None
        since = self.asked_since or self.since
        until = self.asked_until or self.until
        lo = when(since) if since else "the start"
        hi = when(until) if until else "the end"
        widened = ""
        if (since, until) != (self.since, self.until):
            lo_h = when(self.since) if self.since else "the start"
            hi_h = when(self.until) if self.until else "the end"
            widened = f", taken as the whole hours {lo_h} – {hi_h} (the GPU-hour facts are hourly)"
        return (f"Window asked: {lo} – {hi} UTC{widened}; borrowing and reclaim cover all "
                "the data.")

    def text(self) -> str:
        """``2026-01-05 00:00 – 2026-01-06 00:00 UTC (24 h)``."""
        start, end = self.start, self.end
        if start is None or end is None or end <= start:
            return "no data in this window"
        hours = (end - start).total_seconds() / 3600
        # rounded as every number of the report (a half up: 15 minutes read "0.2 h")
        span = f"{hours:,.0f} h" if hours < 72 and hours == int(hours) else \
            f"{number(hours, 1)} h" if hours < 72 else f"{number(hours / 24, 1)} days"
        return f"{when(start)} – {when(end)} UTC ({span})"


@dataclass(frozen=True)
class Answer:
    section: Section
    columns: list[str]
    rows: list[tuple[Any, ...]]
    chart_columns: list[str]
    chart_rows: list[tuple[Any, ...]]
    """The rows the chart draws (the table's, unless the chart has its own SQL)."""

    def column(self, name: str) -> list[Any]:
        i = self.columns.index(name)
        return [r[i] for r in self.rows]


@dataclass(frozen=True)
class Report:
    window: Window
    answers: list[Answer]


def _utc(value: Any) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


def whole_hours(since: datetime | None, until: datetime | None
                ) -> tuple[datetime | None, datetime | None]:
    """The window widened to whole hours (the roll-ups' grain): ``since`` down to its
    hour, ``until`` up to the next one, so that every section covers the same time."""
    def floor(t: datetime) -> datetime:
        return t.replace(minute=0, second=0, microsecond=0)

    lo = floor(since) if since is not None else None
    hi = None
    if until is not None:
        hi = floor(until) if floor(until) == until else floor(until) + timedelta(hours=1)
    return lo, hi


def data_span(con: duckdb.DuckDBPyConnection) -> tuple[datetime | None, datetime | None]:
    """The first minute of the facts and the end of the last one: from the fragmentation
    facts (one row per pool, card type and minute, small), else to the hour from the
    hourly roll-up (a warehouse without inventory has no fragmentation)."""
    first, last = con.execute(
        "SELECT min(minute), max(minute) + INTERVAL 1 MINUTE FROM frag_minute").fetchall()[0]
    if first is None:
        first, last = con.execute(
            "SELECT min(hour), max(hour) + INTERVAL 1 HOUR FROM gpu_hourly").fetchall()[0]
    if first is None:  # job events alone (no inventory): the attempts' times; the header
        # said "no data in this window" above sections of queue waits and preemptions
        first, last = con.execute(
            "SELECT min(queued_at), max(greatest(queued_at, started_at, ended_at)) "
            "FROM attempts").fetchall()[0]
    return _utc(first), _utc(last)


def answer_all(warehouse: Path, since: datetime | None = None, until: datetime | None = None,
               sections: tuple[Section, ...] = SECTIONS,
               timeout_s: float | None = query.DEFAULT_TIMEOUT_S) -> Report:
    """Each section's rows, in order, and the window they cover; ``timeout_s`` bounds
    each query (Ctrl-C interrupts it too)."""
    con = query.connect(warehouse)  # time buckets and times in UTC (its default)
    asked = (since, until)
    since, until = whole_hours(since, until)
    try:
        window = Window(*data_span(con), since, until, *asked)
        out = []
        for section in sections:
            lo, hi = (since, until) if section.windowed else (None, None)
            columns, rows = query.fetch(con, fill(section.sql, lo, hi, MAX_ROWS), timeout_s)
            chart_columns, chart_rows = columns, rows
            if section.chart is not None and section.chart.sql is not None:
                chart_columns, chart_rows = query.fetch(
                    con, fill(section.chart.sql, lo, hi, MAX_ROWS, window.bucket_minutes),
                    timeout_s)
            out.append(Answer(section, columns, rows, chart_columns, chart_rows))
        return Report(window, out)
    except duckdb.Error as exc:  # a missing or damaged fact object: say what to do
        damaged = query.unreadable(con, exc)
        if damaged is not None:
            raise query.QueryError(damaged) from None
        raise
    finally:
        query.close_connection(con)
