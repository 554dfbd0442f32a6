"""The report as tables in the terminal (rich), the same numbers as the HTML report.

Tables show the first ``top`` rows and say how many more there are; the columns marked
``terminal=False`` are left out so that a table fits 80 columns. Job ids and figures are
never cut nor wrapped (an id wider than half the terminal folds over lines, whole):
headers wrap at their spaces, then names (team, pool, queue, card type) give way, at
most :data:`NAME_MOST` wide, shortened with "…"; a column that still has no room is left
out and named under the table.
"""

from __future__ import annotations

from rich import box
from rich.console import Console, Group, RenderableType
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from gpuledger.pipeline.analyst_report.answers import MAX_ROWS, Answer, Report, no_rows
from gpuledger.pipeline.analyst_report.numbers import cell, shorten
from gpuledger.pipeline.analyst_report.sections import PARTS, Column
from gpuledger.pipeline.terminal_fit import header, printable

NAME_MOST = 24
"""The widest a free-text column (team, pool, queue, card type) grows: a 500-character
team took the table and left the figures one or two characters."""
NAME_LEAST = 8
"""The narrowest a free-text column gives way to before a column is left out."""
NAME_LONGEST = 2 * NAME_MOST
"""A name longer than this is shortened with an ellipsis before it wraps (at most two
lines of a column at its widest)."""


def _shown(a: Answer) -> list[Column]:
    """The columns of the terminal table (sparse ones only when they hold something),
    before any is left out for want of room."""
    return [c for c in a.section.columns
            if c.terminal and not (c.sparse and not any(a.column(c.name)))]


def _least(title: str, cells: list[str], column: Column) -> int:
    """The fewest columns a column takes: its header's longest word, and a key's or a
    figure's whole text (never cut nor wrapped), a wrapping word's longest word, a
    name's :data:`NAME_LEAST`."""
    widths = [max(len(w) for w in title.split())]
    for text in cells:
        if column.key or (column.numeric and any(ch.isdigit() for ch in text)):
            widths.append(len(text))
        elif column.numeric:
            widths.append(max([len(w) for w in text.split()] or [0]))
        else:
            widths.append(min(len(text), NAME_LEAST))
    return max(widths)


def _most(title: str, cells: list[str], column: Column) -> int:
    natural = max([len(title), *(len(t) for t in cells)])
    if column.key or column.numeric:
        return natural
    return max(min(natural, NAME_MOST), max(len(w) for w in title.split()))


def _table(a: Answer, top: int, console: Console, empty: str
           ) -> tuple[RenderableType, list[Column]]:
    """The table, and the columns it has no room for (named under it); ``empty``: what
    a section without rows says."""
    section = a.section
    if not a.rows:
        # the title and one line: an empty table's headers said nothing, and the line in
        # its first column wrapped to a word per line ('no rows / in this / window')
        return Group(Text(section.title, style="bold"), Text(f"  {empty}", style="dim")), []
    shown = _shown(a)

    def text(value: object, column: Column, row: tuple[object, ...]) -> str:
        out = printable(cell(value, column, dict(zip(a.columns, row, strict=True))))
        return out if column.key or column.numeric else shorten(out, NAME_LONGEST)

    cells = {c.name: [text(r[a.columns.index(c.name)], c, r) for r in a.rows[:top]]
             for c in shown}

    def build(columns: list[Column], widths: list[int]) -> Table:
        # the columns are parted by the box's one space alone
        table = Table(title=section.title, title_justify="left", title_style="bold",
                      box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                      padding=(0, 0))
        for column, width in zip(columns, widths, strict=True):
            # a name wraps at its spaces, and a word wider than its column ends in "…";
            # keys and figures fit their column whole (its width is at least theirs)
            table.add_column(header(column.title, width), width=width,
                             overflow="fold" if column.key or column.numeric else "ellipsis",
                             justify="right" if column.numeric else "left")
        for k in range(len(a.rows[:top])):  # cells are data (a team named '[/]'): never
            table.add_row(*(Text(cells[c.name][k]) for c in columns))  # read as markup
        return table

    unbounded = console.options.update_width(100_000)

    def excess(columns: list[Column], widths: list[int]) -> int:
        return console.measure(build(columns, widths), options=unbounded).maximum \
            - console.width

    columns = list(shown)
    least = {c.name: _least(c.title, cells[c.name], c) for c in shown}
    for c in shown:  # an id wider than half the table folds over lines, whole
        if c.key:
            least[c.name] = min(least[c.name], max(NAME_MOST, console.width // 2))
    most = {c.name: _most(c.title, cells[c.name], c) for c in shown}
    # the columns that do not fit even at their narrowest go, the last first (keys stay)
    while excess(columns, [least[c.name] for c in columns]) > 0 and any(
            not c.key for c in columns[1:]):
        columns.remove(next(c for c in reversed(columns) if not c.key))
    widths = [most[c.name] for c in columns]
    over = excess(columns, widths)
    for names in (False, True):  # headers wrap first, then names give way; in each
        # turn the column with the most room to give gives first
        turn = [i for i, c in enumerate(columns) if (not c.key and not c.numeric) == names]
        while over > 0 and turn:
            k = max(turn, key=lambda i: widths[i] - least[columns[i].name])
            if widths[k] <= least[columns[k].name]:
                break
            widths[k] -= 1
            over -= 1
    return build(columns, widths), [c for c in a.section.columns if c not in columns]


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
        table, hidden = _table(a, top, console, no_rows(a.section, report.window))
        console.print(table)
        if len(a.rows) > top:
            more = (f"… and {len(a.rows) - top:,} more rows: gpuledger report --html FILE "
                    "folds them under the table" if len(a.rows) < MAX_ROWS else
                    # the section read MAX_ROWS rows: how many more there are is unknown
                    f"… and at least {len(a.rows) - top:,} more rows: the HTML report folds "
                    f"up to {MAX_ROWS:,} in all, the views of sql/20_analyst.sql have every one")
            console.print(more, style="dim", overflow="fold")
        if hidden and a.rows:
            console.print(f"Also in the HTML report: {', '.join(c.title for c in hidden)}.",
                          style="dim",
                          overflow="fold")
        for note in a.section.notes:
            console.print(note, style="dim", overflow="fold")
        console.print()
