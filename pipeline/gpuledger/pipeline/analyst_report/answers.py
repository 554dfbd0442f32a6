"""Run every section's SQL on the warehouse (one read-only connection)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuledger.pipeline import query
from gpuledger.pipeline.analyst_report.sections import SECTIONS, Section, render_sql


@dataclass(frozen=True)
class Answer:
    section: Section
    columns: list[str]
    rows: list[tuple[Any, ...]]


def answer_all(warehouse: Path, since: datetime | None = None, until: datetime | None = None,
               top: int = 10, sections: tuple[Section, ...] = SECTIONS,
               timeout_s: float | None = query.DEFAULT_TIMEOUT_S) -> list[Answer]:
    """Each section's rows, in order; ``timeout_s`` bounds each section's query."""
    con = query.connect(warehouse)
    try:
        out = []
        for section in sections:
            columns, rows = query.fetch(con, render_sql(section, since, until, top), timeout_s)
            out.append(Answer(section, columns, rows))
        return out
    finally:
        con.close()
