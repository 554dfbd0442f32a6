"""Tables that fit the terminal without cutting a figure.

rich shrinks a table wider than its console by cutting cells ("+43.…"): a figure lost.
:func:`fitted` builds a table at its natural widths and, when that is too wide, builds it
again with widths that fit: headers wrap at spaces (and, with ``hyphens``, after a
hyphen or an underscore: "no-" over "preemption"), cells stay whole (or, with
``cells_wrap``, wrap at their spaces: "50.1 (+43.6)" as two lines; with ``WORDS``, only
the cells that hold no figure: "no telemetry" in a column of GPU-hours), and the column
with the most room gives first. Used by ``gpuledger report`` and ``gpuledger whatif``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Literal

from rich.console import Console
from rich.table import Table

_PIECE = re.compile(r"[^\s_-]*[_-]+|[^\s_-]+")

CONTROL_ESCAPES = ({c: f"\\x{c:02x}" for c in [*range(32), *range(127, 160)]}
                   | {ord("\n"): "\\n", ord("\t"): "\\t", ord("\r"): "\\r",
                      0x2028: "\\u2028", 0x2029: "\\u2029"})
"""Control characters (C0, DEL, C1) and the Unicode line and paragraph separators as
escapes: a value from the input (a Slurm job name, a team) written raw to a terminal
broke its table's row at a newline, and its escape sequences (``ESC[31m``) ran in the
terminal."""
CONTROL_PATTERN = "[" + "".join(f"\\x{{{c:x}}}" for c in sorted(CONTROL_ESCAPES)) + "]"
"""The characters of :data:`CONTROL_ESCAPES` as a regular expression (Polars' syntax)."""


BIDI_ESCAPES = {c: f"\\u{c:04x}" for c in (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F),
                                           *range(0x2066, 0x206A))}
"""Bidirectional controls as escapes: a job id or team with a right-to-left override
(U+202E) read reversed in the terminal ('1000015' as '5100001'), and reversed the
cells after it on its line."""
_TERMINAL_ESCAPES = CONTROL_ESCAPES | BIDI_ESCAPES


def printable(text: str) -> str:
    """``text`` with :data:`CONTROL_ESCAPES` and :data:`BIDI_ESCAPES` escaped, for a
    terminal (the report's tables, ``gpuledger query``'s, ``whatif``'s)."""
    return text.translate(_TERMINAL_ESCAPES)

WORDS: Literal["words"] = "words"
"""A column's ``cells_wrap``: its cells that hold no digit (words, such as "nothing
allocated" among GPU-hours) wrap at their spaces; its figures ("< 0.1",
"15,741,660.0") stay whole."""
Wrap = bool | Literal["words"]


def _pieces(text: str, hyphens: bool) -> list[str]:
    """The words of ``text``; with ``hyphens``, words broken after their hyphens and
    underscores (``no-preemption``, ``allocated_gpu_h``)."""
    if not hyphens:
        return text.split()
    return [p for word in text.split() for p in _PIECE.findall(word)]


def header(title: str, width: int | None, hyphens: bool = False) -> str:
    """``title`` in lines of at most ``width`` (where its pieces allow), broken at spaces
    and, with ``hyphens``, after hyphens; unchanged where it fits."""
    if width is None or len(title) <= width:
        return title
    lines: list[str] = []
    for word in title.split():
        for i, piece in enumerate(_pieces(word, hyphens)):
            glue = "" if i else " "  # a hyphen's next piece joins without a space
            if lines and len(lines[-1]) + len(glue) + len(piece) <= width:
                lines[-1] += glue + piece
            else:
                lines.append(piece)
    return "\n".join(lines)


def _narrowest(cell: str, wraps: Wrap) -> int:
    """The fewest columns ``cell`` takes: its longest word where it may wrap, else its
    length."""
    if wraps is True or (wraps == WORDS and not any(ch.isdigit() for ch in cell)):
        return max([len(w) for w in cell.split()] or [0])
    return len(cell)


def fit_widths(titles: list[str], rows: list[list[str]], excess: int,
               cells_wrap: Wrap | Sequence[Wrap] = False, hyphens: bool = False
               ) -> list[int]:
    """Column widths ``excess`` columns narrower than the natural ones, as far as each
    column's narrowest (its header's longest piece; its longest word where its cells
    wrap, per column with a sequence, or its longest cell) allows."""
    wraps = ([cells_wrap] * len(titles) if isinstance(cells_wrap, bool | str)
             else list(cells_wrap))

    def longest(text: str) -> int:
        return max([len(p) for p in _pieces(text, hyphens)] or [0])

    hi = [max([len(t), *(len(r[k]) for r in rows)]) for k, t in enumerate(titles)]
    lo = [max([longest(t)] + [_narrowest(r[k], wraps[k]) for r in rows])
          for k, t in enumerate(titles)]
    widths = list(hi)
    while excess > 0:
        k = max(range(len(widths)), key=lambda i: widths[i] - lo[i])
        if widths[k] <= lo[k]:
            break
        widths[k] -= 1
        excess -= 1
    return widths


def fitted(build: Callable[[list[int] | None], Table], titles: list[str],
           rows: list[list[str]], console: Console,
           cells_wrap: Wrap | Sequence[Wrap] = False, hyphens: bool = False) -> Table:
    """``build(None)`` when it fits ``console``, else ``build(widths)`` with widths from
    :func:`fit_widths` (columns should fold, never cut, what still does not fit; headers
    go through :func:`header`). ``build`` may lay a table out more tightly when given
    widths (less padding): the excess is measured on that layout."""
    unbounded = console.options.update_width(100_000)

    def excess(table: Table) -> int:
        return console.measure(table, options=unbounded).maximum - console.width

    full = build(None)
    if excess(full) <= 0:
        return full
    compact = build(fit_widths(titles, rows, 0))  # the natural widths, tighter
    over = excess(compact)
    if over <= 0:
        return compact
    return build(fit_widths(titles, rows, over, cells_wrap, hyphens))
