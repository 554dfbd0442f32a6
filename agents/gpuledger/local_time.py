"""Times as exports and people write them: why a text shaped as an ISO 8601 date names
no day that exists (``2026-02-29``), and what a time zone does at a local time its
clocks skip or repeat (daylight-saving changes).

Standard library only: the command line's argument parsing uses it before the pipeline
is loaded; the importers (``import slurm-sacct``, ``import pods``) use it for their lines.
"""

from __future__ import annotations

import calendar
import re
from datetime import UTC, datetime, tzinfo

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


def zone_name(tz: tzinfo) -> str:
    """The zone's name as ``--tz`` takes it (``Europe/Berlin``)."""
    return str(getattr(tz, "key", None) or tz)


def change_at(value: datetime, tz: tzinfo) -> str | None:
    """``"skipped"`` where ``tz`` skips the local time ``value`` (naive), ``"repeated"``
    where it occurs twice, else ``None``. Python's two readings (``fold``) of such a time
    differ in offset: the first has the offset before the change, smaller than the
    second's where the clocks jump forward (a gap), larger where they go back."""
    first = value.replace(tzinfo=tz, fold=0).utcoffset()
    second = value.replace(tzinfo=tz, fold=1).utcoffset()
    if first is None or second is None or first == second:
        return None
    return "skipped" if first < second else "repeated"


def clock_change(value: datetime, tz: tzinfo) -> str | None:
    """What ``tz`` does at the local time ``value`` (naive) where its clocks change: it
    skips it (``does not exist in time zone Europe/Berlin: the clocks jump from 02:00 to
    03:00 on 2026-03-29``) or it repeats it (``occurs twice in time zone Europe/Berlin:
    the clocks go back from 03:00 to 02:00 on 2026-10-25``); ``None`` for a local time
    that occurs once (:func:`change_at`)."""
    kind = change_at(value, tz)
    if kind is None:
        return None
    skipped = kind == "skipped"
    first = value.replace(tzinfo=tz, fold=0).utcoffset()
    second = value.replace(tzinfo=tz, fold=1).utcoffset()
    assert first is not None and second is not None
    name = zone_name(tz)
    what = (f"does not exist in time zone {name}" if skipped
            else f"occurs twice in time zone {name}")
    try:
        # the instant of the change lies between the two readings: found to the second
        lo = int((value - max(first, second)).replace(tzinfo=UTC).timestamp())
        hi = int((value - min(first, second)).replace(tzinfo=UTC).timestamp()) + 1
        before = datetime.fromtimestamp(lo, UTC).astimezone(tz).utcoffset()
        after = datetime.fromtimestamp(hi, UTC).astimezone(tz).utcoffset()
        if before is None or after is None or before == after:
            return what
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if datetime.fromtimestamp(mid, UTC).astimezone(tz).utcoffset() == before:
                lo = mid
            else:
                hi = mid
        change = datetime.fromtimestamp(hi, UTC).replace(tzinfo=None)
    except (OverflowError, OSError, ValueError):  # at the calendar's ends
        return what
    old, new = change + before, change + after
    return (f"{what}: the clocks {'jump' if skipped else 'go back'} from {_clock(old)} to "
            f"{_clock(new)} on {new:%Y-%m-%d}")


def _clock(t: datetime) -> str:
    return f"{t:%H:%M:%S}" if t.second else f"{t:%H:%M}"
