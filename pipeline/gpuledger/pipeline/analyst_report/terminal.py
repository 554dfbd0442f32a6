"""The report as tables in the terminal (rich), the same numbers as the HTML report.

Tables show the first ``top`` rows and say how many more there are; the columns marked
``terminal=False`` are left out so that a table fits 80 columns. Job ids are never cut:
other cells wrap instead when the terminal is narrower still.
"""

from __future__ import annotations

from rich import box
from rich.console import Console, Group, RenderableType
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from gpuledger.pipeline.analyst_report.answers import MAX_ROWS, NO_ROWS, Answer, Report
from gpuledger.pipeline.analyst_report.numbers import cell
from gpuledger.pipeline.analyst_report.sections import PARTS, Column
from gpuledger.pipeline.terminal_fit import WORDS, fitted, printable


def _shown(a: Answer) -> list[Column]:
    """The columns of the terminal table (sparse ones only when they hold something)."""
    return [c for c in a.section.columns
            if c.terminal and not (c.sparse and not any(a.column(c.name)))]


def _table(a: Answer, top: int, console: Console) -> RenderableType:
    section = a.section
    if not a.rows:
        # the title and one line: an empty table's headers said nothing, and the line in
        # its first column wrapped to a word per line ('no rows / in this / window')
        return Group(Text(section.title, style="bold"), Text(f"  {NO_ROWS}", style="dim"))
    shown = _shown(a)
    index = [a.columns.index(c.name) for c in shown]
    rows = [[printable(cell(r[i], c, dict(zip(a.columns, r, strict=True))))
             for i, c in zip(index, shown, strict=True)] for r in a.rows[:top]]
    titles = [c.title for c in shown]

    def build(widths: list[int] | None) -> Table:
        # given widths, the columns are parted by the box's one space alone
        table = Table(title=section.title, title_justify="left", title_style="bold",
                      box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                      padding=(0, 1 if widths is None else 0))
        for k, column in enumerate(shown):
            table.add_column(titles[k], width=None if widths is None else widths[k],
                             no_wrap=column.key, overflow="fold",
                             justify="right" if column.numeric else "left")
        for r in rows:   # cells are data (a team named '[/]'): never read as markup
            table.add_row(*(Text(c) for c in r))
        return table

    # text cells wrap at their spaces once the headers have given all they can (a
    # what-if label of 37 characters had rich cut the headers mid-word); keys and
    # figures stay whole, and the words of a figure's column ("nothing allocated") wrap
    return fitted(build, titles, rows, console,
                  cells_wrap=[False if c.key else WORDS if c.numeric else True
                              for c in shown])


def print_report(report: Report, console: Console, top: int) -> None:
    """Every section: its part's question, the table, what is left out, the notes."""
    console.print(Text("gpuledger report: where the GPUs go", style="bold"))
    console.print(f"Data: {report.window.text()}", markup=False)
    asked = report.window.asked()
    if asked is not None:
        console.print(asked, overflow="fold", markup=False)
    part = None
    for a in report.answers:
        if a.section.part != part:
            part = a.section.part
            console.print()
            console.print(Rule(PARTS[part], align="left"))
        console.print(_table(a, top, console))
        if len(a.rows) > top:
            more = (f"… and {len(a.rows) - top:,} more rows: gpuledger report --html FILE "
                    "folds them under the table" if len(a.rows) < MAX_ROWS else
                    f"… and more rows: the HTML report folds up to {MAX_ROWS:,} in all, the "
                    "views of sql/20_analyst.sql have every one")
            console.print(more, style="dim", overflow="fold")
        hidden = [c.title for c in a.section.columns if c not in _shown(a)]
        if hidden and a.rows:
            console.print(f"Also in the HTML report: {', '.join(hidden)}.", style="dim",
                          overflow="fold")
        for note in a.section.notes:
            console.print(note, style="dim", overflow="fold")
        console.print()
