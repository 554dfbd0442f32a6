"""The report as rich tables in the terminal."""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from gpuledger.pipeline.analyst_report.answers import Answer


def cell(value: Any) -> str:
    """One value as text: empty for NULL, thousands separators, short times."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.1f}"
        return f"{value:.2f}" if abs(value) >= 0.01 or value == 0 else f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    if isinstance(value, date):
        return value.isoformat()
    return str(value)


def print_answers(answers: list[Answer], console: Console) -> None:
    for a in answers:
        table = Table(title=a.section.title, caption=a.section.question,
                      title_justify="left", caption_justify="left")
        for i, name in enumerate(a.columns):
            numeric = any(isinstance(r[i], int | float) and not isinstance(r[i], bool)
                          for r in a.rows)
            table.add_column(name, justify="right" if numeric else "left")
        for r in a.rows:
            table.add_row(*[cell(v) for v in r])
        if not a.rows:
            table.add_row(*(["(none)"] + [""] * (len(a.columns) - 1)))
        console.print(table)
        console.print()
