"""Option parsers shared by the command modules: one wording for every bad value."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuledger.cli.errors import CliError

INT32_MAX = 2**31 - 1
"""The largest value of a Kafka client's 32-bit settings (timeouts in ms)."""
SIMULATED_HOURS_MAX = 8784
"""The longest simulated span a command takes (366 days): the simulator runs a day in
tens of CPU-seconds, and times must stay within the calendar."""


def bounded(kind: type, name: str, *, zero: bool = False, infinite: bool = False,
            at_most: float | None = None, at_least: float | None = None,
            unit: str = "") -> Callable[[str], Any]:
    """An argparse ``type`` for a number of ``kind`` (int or float) named ``name``: > 0
    (``zero``: >= 0), finite unless ``infinite`` (then ``inf`` too), never NaN, and at
    least ``at_least`` / at most ``at_most`` (of ``unit``) when given."""
    def parse(text: str) -> Any:
        what = "a whole number" if kind is int else "a number"
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be {what}, got {text!r}") from None
        if math.isnan(value) or (math.isinf(value) and not infinite):
            raise argparse.ArgumentTypeError(
                f"{name} must be {'a finite number' if not infinite else what}, got {text!r}")
        if value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"{name} must be {'>=' if zero else '>'} 0, "
                                             f"got {text}")
        if at_least is not None and value < at_least:
            raise argparse.ArgumentTypeError(
                f"{name} must be at least {at_least:g}{' ' + unit if unit else ''}, got {text}")
        if at_most is not None and value > at_most:
            limit = f"{int(at_most):,}" if float(at_most).is_integer() else f"{at_most:g}"
            raise argparse.ArgumentTypeError(f"{name} must be at most {limit}, got {text}")
        return value
    return parse


def positive(kind: type, name: str, infinite: bool = False,
             at_most: float | None = None) -> Callable[[str], Any]:
    """A number > 0 of ``kind`` (see :func:`bounded`)."""
    return bounded(kind, name, infinite=infinite, at_most=at_most)


def whole_count(name: str) -> Callable[[str], int]:
    """A whole number >= 0 (a count, a seed)."""
    return bounded(int, name, zero=True)


def print_bad(bad: Sequence[tuple[str, str]], show: int, noun: str) -> None:
    """An importer's ``--show-bad N``: the first ``show`` of ``bad`` (``file:line``,
    reason), then how many more ``noun`` (bad lines, bad rows) there are."""
    for where, reason in bad[:show]:
        print(f"{where}: {reason}")
    if len(bad) > show:
        print(f"... and {len(bad) - show:,} more {noun}")


def non_negative(name: str) -> Callable[[str], float]:
    """A finite number >= 0."""
    return bounded(float, name, zero=True)


def nonempty(name: str) -> Callable[[str], str]:
    """An argparse ``type`` for text that is not empty or blank."""
    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{name} must not be empty")
        return text
    return parse


def file_name_part(name: str, what: str) -> Callable[[str], str]:
    """An argparse ``type`` for an id that also names a file or folder (a consumer group's
    checkpoint folder, an instance's checkpoint): any text a file name can hold, never a
    path (``a/b``, ``..``) nor blank or with control characters."""
    def parse(text: str) -> str:
        if (not text.strip() or text in (".", "..") or len(text) > 249
                or any(c in "/\\" or not c.isprintable() for c in text)):
            raise argparse.ArgumentTypeError(
                f"{name} {text[:80]!r}: not a name a file can have: 1 to 249 printable "
                f"characters, no '/' or '\\', not '.' or '..' (it names {what})")
        return text
    return parse


TERMINAL_COLUMNS_MIN = 40
"""The narrowest terminal the tables are drawn for (below it a cell is cut every few
characters)."""


_WAREHOUSE_WHAT = ("warehouse: a folder or s3://bucket/prefix (S3 settings and credentials "
                   "from the AWS_* variables, docs/warehouse.md); default: ")
WAREHOUSE_HELP = _WAREHOUSE_WHAT + "warehouse.url of the configuration, else ./warehouse"
"""``--warehouse`` of a command that takes ``--config``."""
READ_WAREHOUSE_HELP = _WAREHOUSE_WHAT + "GPULEDGER_WAREHOUSE__URL, else ./warehouse"
"""``--warehouse`` of a reader without ``--config`` (query, report)."""

TERMINAL_COLUMNS_MAX = 10_000
"""The widest ``--width``: the report pads its rules to the width (10⁸ ran past 200 s,
writing gigabytes)."""


def terminal_width(name: str) -> Callable[[str], int]:
    """A terminal width: a whole number of columns, from :data:`TERMINAL_COLUMNS_MIN` to
    :data:`TERMINAL_COLUMNS_MAX`."""
    return bounded(int, name, at_least=TERMINAL_COLUMNS_MIN, at_most=TERMINAL_COLUMNS_MAX,
                   unit="columns")


def warehouse_location(text: str | None, config: Path | None = None) -> str | Path:
    """``--warehouse`` as a local ``Path`` or an ``s3://`` URL; without it, the
    configuration's ``warehouse.url`` (file or ``GPULEDGER_WAREHOUSE__URL``), else
    ``./warehouse``. A scheme gpuledger does not serve is a :class:`CliError`."""
    from gpuledger.pipeline.location import check_location

    if text is None:
        from gpuledger.pipeline.config import ConfigError, load_config

        try:
            text = load_config(config).warehouse.url or "warehouse"
        except ConfigError as exc:
            raise CliError(f"configuration: {exc}") from None
    return check_location(text)


def time_limit(name: str) -> Callable[[str], float]:
    """An argparse ``type`` for a time limit in seconds: > 0, ``inf`` for none."""
    number = positive(float, name, infinite=True)

    def parse(text: str) -> float:
        try:
            value: float = number(text)
        except argparse.ArgumentTypeError as exc:
            if "> 0" in str(exc):
                raise
            raise argparse.ArgumentTypeError(
                f"{name} must be a number of seconds, got {text!r}") from None
        return value
    return parse


TIME_RANGE = (datetime(1970, 1, 1, tzinfo=UTC), datetime(9000, 1, 1, tzinfo=UTC))
"""The times an option takes (:func:`iso_time`): a window is widened to whole hours and
days, and a time at the calendar's ends (9999-12-31T23:59) overflowed there, a
traceback."""


def iso_time(text: str) -> datetime:
    """An argparse ``type`` for an ISO 8601 time (UTC when no offset is given), in
    :data:`TIME_RANGE`."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time such as 2026-01-05T00:00Z, got {text!r}") from None
    value = value if value.tzinfo else value.replace(tzinfo=UTC)
    try:
        inside = TIME_RANGE[0] <= value.astimezone(UTC) < TIME_RANGE[1]
    except OverflowError:
        inside = False
    if not inside:
        raise argparse.ArgumentTypeError(
            f"{text!r} is outside the years {TIME_RANGE[0].year}-{TIME_RANGE[1].year - 1}")
    return value


def add_replace(parser: argparse.ArgumentParser) -> None:
    """An importer's ``--replace``: replace facts it did not write (ingest.import_history)."""
    parser.add_argument(
        "--replace", action="store_true",
        help="import even where the warehouse already holds facts in the hours the input "
        "covers that an import of the same events did not write (an ingest, the Kafka "
        "service, another file): they are replaced by this input's alone. Without it such "
        "an import is refused and changes nothing")
