"""One way to print a number in the report, in the terminal and in HTML alike.

Thousands separators and a fixed number of decimals per column (the column's
``decimals``): values come from SQL unrounded and are rounded once, here, so a column
never mixes ``84.30`` and ``110.9``, and 1.667 prints as 1.7 (never "1.70"). A value
that is not zero but rounds to zero prints as ``< 0.1``, not as a false 0.
"""

from __future__ import annotations

import math
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from gpuledger.pipeline.analyst_report.sections import Column

NOISE = 1e-9
"""Below this a value is zero (sums of floats leave such crumbs)."""
KEPT_DECIMALS = 6
"""Decimals a value keeps before it is rounded for show: the facts are exact to 1e-9
GPU-minute each, and a sum of many drifts in its last digits."""


def number(value: float, decimals: int) -> str:
    """``value`` with ``decimals`` decimals and thousands separators, a half rounded away
    from zero as the value reads (0.25 → 0.3, 0.35 → 0.4: binary formatting gave 0.2
    and 0.3, the first half to even, the second as 0.34999…). The crumbs of summed
    floats are dropped first (:data:`KEPT_DECIMALS`): 7.749999999 GPU-h, a sum of facts
    rounded to 1e-9, is 7.75 and reads 7.8, as the same 7.75 summed another way does."""
    if abs(value) < NOISE:
        value = 0.0
    if math.isfinite(value):
        shown = Decimal(repr(round(float(value), KEPT_DECIMALS))).quantize(
            Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP)
        text = f"{shown:,.{decimals}f}"
    else:
        text = f"{value:,.{decimals}f}"
    if value != 0 and float(text.replace(",", "")) == 0:
        step = f"{10.0 ** -decimals:.{decimals}f}"
        return f"< {step}" if value > 0 else f"> -{step}"
    return text


def when(value: datetime | date) -> str:
    """A time in UTC, to the minute (the report says UTC in its header and axes)."""
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC)
        return value.strftime("%Y-%m-%d %H:%M")
    return value.isoformat()


def shorten(text: str, most: int) -> str:
    """``text``, cut to ``most`` characters with an ellipsis when longer."""
    return text if len(text) <= most else text[:most - 1] + "…"


def cell(value: Any, column: Column, row: dict[str, Any] | None = None) -> str:
    """One table cell as text; an empty value shows the column's explanation (the
    ``blank_when`` one when the row's other column is zero or empty)."""
    if value is None:
        if column.blank_when is not None and row is not None:
            other, text = column.blank_when
            if not row.get(other):
                return text
        return column.blank
    if isinstance(value, bool):
        return "yes" if value else "no"
    if column.decimals is not None and isinstance(value, int | float):
        return number(float(value), column.decimals)
    if isinstance(value, datetime | date):
        return when(value)
    return str(value)
