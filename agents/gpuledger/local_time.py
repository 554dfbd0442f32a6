"""Times as exports and people write them: why a text shaped as an ISO 8601 date names
no day that exists (``2026-02-29``).

Standard library only: the command line's argument parsing uses it before the pipeline
is loaded; the importers (``import slurm-sacct``, ``import pods``) use it for their lines.
"""

from __future__ import annotations

import calendar
import re

_ISO = re.compile(r"\s*([0-9]{4})-?([0-9]{2})-?([0-9]{2})"
                  r"(?:[T ]([0-9]{2})(?::?([0-9]{2})(?::?([0-9]{2}))?)?)?")


def not_a_date(text: str) -> str | None:
    """Why ``text``, shaped as an ISO 8601 date (and time of day), names none that
    exists, said after the text: ``is not a date: 2026 has no February 29``; ``None``
    where it is not so shaped (``yesterday``) or its date and time of day exist (the
    reason it does not read is elsewhere)."""
    m = _ISO.match(text)
    if m is None:
        return None
    year, month, day = (int(m[i]) for i in (1, 2, 3))
    if year == 0:
        return "is not a date: there is no year 0"
    if not 1 <= month <= 12:
        return f"is not a date: there is no month {month}"
    days = calendar.monthrange(year, month)[1]
    if day == 0:
        return "is not a date: there is no day 0"
    if day > days:
        if month == 2 and day == 29:
            return f"is not a date: {year} has no February 29 (not a leap year)"
        return (f"is not a date: {calendar.month_name[month]} {year} has {days} days, "
                f"not {day}")
    for value, name, most in ((m[4], "hour", 23), (m[5], "minute", 59),
                              (m[6], "second", 59)):
        if value is not None and int(value) > most:
            return f"is not a time of day: there is no {name} {int(value)} (0-{most})"
    return None
