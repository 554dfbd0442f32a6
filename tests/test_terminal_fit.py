"""Terminal tables that fit: headers broken where they may be, cells never cut."""

from __future__ import annotations

import pytest
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpuledger.pipeline.terminal_fit import WORDS, fit_widths, fitted, header


@pytest.mark.parametrize(("title", "width", "hyphens", "lines"), [
    ("no-preemption", 13, True, ["no-preemption"]),
    ("no-preemption", 10, True, ["no-", "preemption"]),
    ("no-preemption", 10, False, ["no-preemption"]),      # no break point: whole
    ("allocated_gpu_h", 10, True, ["allocated_", "gpu_h"]),
    ("calib. error", 6, True, ["calib.", "error"]),
    ("Used of allocated (%)", 9, False, ["Used of", "allocated", "(%)"]),
])
def test_header_breaks_at_spaces_and_optionally_hyphens(title: str, width: int,
                                                        hyphens: bool,
                                                        lines: list[str]) -> None:
    assert header(title, width, hyphens).split("\n") == lines


def test_widths_give_from_the_roomiest_column_down_to_its_longest_piece() -> None:
    titles, rows = ["key", "a-very-long-name"], [["research-lab", "7.2 (+5.9)"]]
    assert fit_widths(titles, rows, 0) == [12, 16]
    assert fit_widths(titles, rows, 6) == [12, 16]           # no break point in the header
    assert fit_widths(titles, rows, 4, hyphens=True) == [12, 12]  # it wraps after a hyphen
    assert fit_widths(titles, rows, 99, hyphens=True) == [12, 10]  # the cell stays whole
    assert fit_widths(titles, rows, 99, cells_wrap=True, hyphens=True) == [12, 6]
    # per column: the name wraps at its hyphen-free spaces only (none), the figure does
    assert fit_widths(titles, rows, 99, cells_wrap=[False, True], hyphens=True) == [12, 6]
    assert fit_widths(["team", "n"], [["research lab a", "7"]], 99, cells_wrap=[True, False]
                      ) == [8, 1]
    # a figure's column: its words wrap, its figures ("< 0.1" too) stay whole
    words = [["nothing allocated"], ["15,741,660.0"], ["< 0.1"]]
    assert fit_widths(["n"], words, 99, cells_wrap=WORDS) == [12]
    assert fit_widths(["n"], words[::2], 99, cells_wrap=[WORDS]) == [9]
    assert fit_widths(["n"], words[::2], 99) == [17]


def test_a_table_too_wide_is_fitted_and_keeps_every_figure() -> None:
    titles = ["key", *(f"policy-number-{i}" for i in range(6))]
    rows = [["team-a", *(f"{1000 + i}.5 (+{i}.25)" for i in range(6))]]

    def build(widths: list[int] | None) -> Table:
        table = Table(show_edge=False, padding=(0, 1 if widths is None else 0))
        for k, name in enumerate(titles):
            w = None if widths is None else widths[k]
            table.add_column(Text(header(name, w, True)), width=w, overflow="fold")
        table.add_row(*rows[0])
        return table

    console = Console(width=80, record=True)
    console.print(fitted(build, titles, rows, console, cells_wrap=True, hyphens=True))
    text = console.export_text()
    assert "…" not in text and max(map(len, text.splitlines())) <= 80
    words = set(text.replace("│", " ").split())
    assert all(f"{1000 + i}.5" in words and f"(+{i}.25)" in words for i in range(6))
