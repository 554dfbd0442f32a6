"""Reading the importers' CSV files: rows with their line numbers, and one clear error
(``file:line: reason``) for text that cannot be read at all — not UTF-8 (a UTF-8 byte
order mark is fine), a field over the CSV reader's size limit."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from typing import Literal


def first_non_utf8_line(path: Path) -> int:
    """The number of the first line of ``path`` that is not UTF-8 (1 if none is found)."""
    with path.open("rb") as f:
        for number, line in enumerate(f, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return 1


def csv_rows(path: Path, error: type[Exception], delimiter: str = ",",
             quoting: Literal[0, 1, 2, 3] = csv.QUOTE_MINIMAL, one_line: bool = False
             ) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of each record of ``path`` (the header included); text that
    cannot be read raises ``error("file:line: reason")``. ``quoting``: ``csv.QUOTE_NONE``
    for text without quoting (``sacct --parsable2``), whose ``"`` are the fields' own.
    ``one_line``: a record over several lines (a quoted field with a line break) must
    have the header's count of fields; one that has not is a ``"`` left open, which
    raises ``error`` naming the line it opens on (it swallowed every line after it into
    one field, in silence)."""
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f, delimiter=delimiter, quoting=quoting)
        start = 1
        width: int | None = None
        try:
            for fields in reader:
                if one_line and reader.line_num > start and width is not None \
                        and len(fields) != width:
                    raise error(f"{path}:{start}: a field runs over "
                                f"{reader.line_num - start + 1:,} lines (to line "
                                f"{reader.line_num:,}): a '\"' without its closing '\"'")
                if width is None:
                    width = len(fields)
                yield start, fields
                start = reader.line_num + 1
        except UnicodeDecodeError:
            raise error(f"{path}:{first_non_utf8_line(path)}: not UTF-8 text") from None
        except csv.Error as exc:
            raise error(f"{path}:{reader.line_num}: {exc}") from None


def header_and_rows(path: Path, error: type[Exception], delimiter: str = ","
                    ) -> tuple[list[str], Iterator[tuple[int, dict[str, str], int]]]:
    """The header of ``path`` (empty for an empty file) and its rows as dicts by column
    name (missing trailing fields are empty), each with the number of fields it has past
    the header's (a ``,`` in a field left unquoted: the row is the caller's to refuse, as
    its fields moved along). A column named twice raises ``error``: which of the two
    holds the values is not known. A ``"`` left open is refused (``csv_rows``' one_line)."""
    rows = csv_rows(path, error, delimiter, one_line=True)
    number, header = next(rows, (0, []))
    seen: set[str] = set()
    for name in header:
        if name and name in seen:
            raise error(f"{path}:{number}: column {name!r} appears twice in the header")
        seen.add(name)

    def as_dicts() -> Iterator[tuple[int, dict[str, str], int]]:
        for number, fields in rows:
            yield (number, dict(zip(header, fields + [""] * (len(header) - len(fields)),
                                    strict=False)), max(len(fields) - len(header), 0))

    return header, as_dicts()
