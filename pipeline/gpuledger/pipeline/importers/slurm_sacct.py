"""Import Slurm accounting history: ``sacct --parsable2`` output → contract events.

Export (``docs/import.md``)::

    sacct --allusers --duplicates --parsable2 --starttime 2026-01-01 --endtime now \\
      --format JobID,JobIDRaw,JobName,Account,User,Partition,QOS,Priority,Submit,Start,End,\\
    State,ExitCode,AllocTRES,ReqTRES,NodeList > sacct.txt

Columns (header names as sacct prints them; any order; unknown columns ignored):
``JobID``, ``Submit``, ``Start``, ``End``, ``State`` and one of ``AllocTRES`` /
``ReqTRES`` are required; ``JobIDRaw``, ``JobName``, ``Account``, ``User``,
``Partition``, ``QOS``, ``Priority``, ``ExitCode``, ``NodeList`` are used when present,
and so is ``GresIDX`` (not a sacct field: GPU indices recorded by a job-completion script
or prolog, ``node:0-1;node2:3`` or just ``0-1`` for one node).

Rules:

* step lines (``123.batch``, ``123.0``, ``123.extern``) are skipped; array tasks
  (``123_4``) are jobs of their own, with ``JobIDRaw`` as the id when present;
  not-yet-started array ranges (``123_[5-9]``) are skipped and counted; jobs with no
  GPU in ``AllocTRES`` (or ``ReqTRES`` when nothing is allocated) are skipped;
* several files (daily or monthly exports) are one history: lines of one attempt (the
  same job id and Submit), in one file or several (a job running at the end of one
  export's window is in the next one too), are one attempt: the line that knows most is
  taken (an End over none, a Start over none, else the last one given), the others are
  counted (``attempts_merged``);
* going on from the warehouse's history (a later export imported alone, :class:`History`,
  ``continued_import.py``): the events its job book took already, and a known job's
  submission, are left out (``events_before``); an attempt it holds running keeps its
  GPUs; a job with events before its end that it did not take is named
  (``unknown_before``: the import is refused), and so is a job it holds running at its
  end that the exports do not print (``running_missing``: they start after its end);
  the inventory starts at its end, and a node is sent only where it changed;
* the lines of one job (``--duplicates`` prints one per attempt) in Submit order: the
  first gives ``submitted`` at its Submit, with the job's attributes through the
  mapping (``docs/mapping.md``); each attempt with a Start gives ``started`` at Start;
  an attempt followed by another ends with ``requeued`` at its own End (Slurm sets End
  to the requeue time; the next Submit is written only after the epilog), or at the
  next Submit when End is unknown, and never after the next attempt's Start; the next
  attempt waits from there to its Start; PREEMPTED gives ``preempted`` at that end
  first (and ``cancelled`` when no attempt follows); COMPLETED → ``finished``;
  CANCELLED → ``cancelled``; FAILED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL,
  DEADLINE → ``failed`` with the state and exit code; RUNNING (End ``Unknown``) → no
  end; PENDING → submitted only; a last line in REQUEUED ends with ``requeued`` at its
  End (pending after);
* a line with another state, times out of order, a date that does not exist
  (``2026-02-29``), a local time that ``tz`` skips (DST gap) or that is out of range in
  UTC, a GPU TRES count that is not a whole number,
  more GPUs on a node than any node has (``MAX_GPUS_PER_NODE``) or a malformed
  NodeList is left out and listed (``bad_lines``); a line identical to an earlier one
  is dropped and counted;
* allocation: ``GresIDX`` when present; else the GPUs are spread evenly over the
  ``NodeList`` nodes and the indices chosen by the shared best-fit placement inside
  each node (``gpuledger.bridges.placement``), in event-time order;
* inventory: from ``--nodes`` (``scontrol -o show node -d`` output), else inferred: a
  node seen in ``NodeList`` has as many GPUs as the most it was seen holding at once
  (or its highest index + 1), the card type of the jobs that ran there and the pool of
  their partition; it holds from the first event time validation accepts (not before
  2000: such an event is rejected alone);
* times without an offset are read in ``tz`` (default UTC: export with ``TZ=UTC sacct``),
  a time that occurs twice (DST fall-back) as the occurrence that keeps its line's times
  in order, the first where both do (:func:`_times`), and a requeued job's attempts
  one after another (:func:`_in_turn`), counted (``repeated_hour``); every time is
  converted to UTC.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import re
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import Any

import polars as pl

from gpuledger.bridges.mapping import Mapping
from gpuledger.bridges.placement import MAX_GPUS_PER_NODE, Placer
from gpuledger.bridges.slurm_events import job_attributes, node_record
from gpuledger.bridges.slurm_parse import (
    SlurmJob,
    SlurmNode,
    SlurmParseError,
    expand_hostlist,
    expand_indices,
    parse_scontrol_nodes,
    parse_tres_gpus,
)
from gpuledger.local_time import change_at, clock_change, not_a_date, zone_name
from gpuledger.pipeline.columns import conform, schema_of
from gpuledger.pipeline.importers.csv_text import csv_rows
from gpuledger.pipeline.validate import MIN_TIME

REQUIRED = ("JobID", "Submit", "Start", "End", "State")
FREE_TEXT = frozenset({"JobName", "Comment", "AdminComment", "SystemComment", "WorkDir",
                       "SubmitLine", "Constraints", "Extra", "Container", "WCKey"})
"""sacct columns whose text a user or an admin chooses. ``--parsable2`` prints them as
they are: a ``|`` or a line break in a job name (Slurm takes both) splits its line into
more fields, or into more lines (:func:`_records`)."""
FAILED = ("FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
          "REVOKED", "SPECIAL_EXIT")
KNOWN_STATES = ("COMPLETED", "CANCELLED", *FAILED, "PREEMPTED", "REQUEUED", "RUNNING",
                "PENDING", "SUSPENDED")
_UNSET = ("", "Unknown", "None", "N/A")
_NO_NODES = ("", "(null)", "None assigned")
_HOST = r"[^\[\],\s]*"
_RANGES = r"\[[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*\]"
_ITEM = rf"(?=[^,]){_HOST}(?:{_RANGES}{_HOST})?"
HOSTLIST = re.compile(rf"{_ITEM}(?:,{_ITEM})*")
"""A host list the importer can expand: names, each with at most one bracket group of
numbers and ascending ranges (``gpu-[001-003,7],login1``)."""


class SacctError(ValueError):
    """The file is not usable sacct output; the message says why."""


@dataclass
class SacctImport:
    """The events of an import and what was left out."""

    frames: dict[str, pl.DataFrame]
    """The events (emptied once the import has validated them)."""
    files: int = 1
    lines: int = 0
    steps_skipped: int = 0
    cpu_only_skipped: int = 0
    pending_arrays_skipped: int = 0
    jobs: int = 0
    attempts: int = 0
    placed_by_importer: int = 0
    duplicates_dropped: int = 0
    attempts_merged: int = 0
    """Attempts printed in more than one line (exports whose windows overlap): the line
    that knows most taken."""
    unplaced: list[str] = field(default_factory=list)
    nodes_inferred: list[str] = field(default_factory=list)
    bad_lines: list[tuple[str, str]] = field(default_factory=list)
    """(``file:line``, reason) of each line left out (the rest is imported)."""
    went_on_from: datetime | None = None
    """Where the warehouse's history ended, when the import went on from it
    (:class:`History`)."""
    events_before: int = 0
    """Going on from a history: events it took already (the export's window overlapping
    the one before), left out."""
    unchanged: bool = False
    """Going on from a history: the exports held nothing it did not take already (a day
    with no job event, the same export again): nothing was written."""
    events_after_until: int = 0
    """Events at or after the exports' end given (``--until``): in the job book, their
    minutes closed by the next import."""
    jobs_before: int = 0
    """Going on from a history: jobs over before where it ended that its job book does
    not remember (exports that overlap by more than it keeps ended jobs): left out."""
    repeated_hour: int = 0
    """Lines with a local time that ``tz`` repeats (the hour the clocks go back)."""
    repeated_hour_second: int = 0
    """Of those, lines with such a time read as its second occurrence (winter time):
    the first put the line's times out of order (:func:`_times`)."""
    names_mended: int = 0
    """Lines whose job name held a ``|`` or a line break (``--parsable2`` prints them as
    they are), read back whole (:func:`_records`)."""
    unknown_before: list[str] = field(default_factory=list)
    """Going on from a history: jobs with events before where it ended that it did not
    take (not in the earlier exports, or told otherwise there): the import is refused."""
    ineligible_before: int = 0
    """Going on from a history: jobs submitted before where it ended that no earlier
    export printed, taken from their submission. sacct prints a job only once it is
    eligible to run: one held, waiting on a dependency or on a begin time is in no
    window before that (real slurmdbd, ``docs/import.md``). Their wait in the minutes the
    history had closed is not in ``pending_minute``; their attempts' queue wait is."""
    running_missing: list[str] = field(default_factory=list)
    """Going on from a history: jobs its book holds running at its end that these
    exports do not print. sacct prints every job that ran in its window, so the exports
    start after the history's end (a day's export missing between them, another
    cluster's): the import is refused; going on, those jobs would never end. (A job
    waiting there may be missing rightly: sacct leaves out a held job, one with no
    eligible time; it waits on in the book.)"""


@dataclass(frozen=True)
class History:
    """What the warehouse's Slurm history holds where an import of a later export goes on
    from it (``continued_import.py``): its jobs, the GPUs its running attempts hold, its
    inventory."""

    closed: datetime
    """Every minute before this is closed: events before it are the history's."""
    seen: dict[str, set[tuple[str, datetime]]]
    """Job id → the (event, time) of each of its events the job book took."""
    running: dict[str, tuple[datetime, list[tuple[str, int, float]]]]
    """Job id → (start, GPUs held) of each running attempt."""
    forgets_before: datetime
    """A job that ended before this is no longer in ``seen`` (the book forgets ended
    jobs ``windows.ended_job_memory_s`` after the history it keeps)."""
    inventory: pl.DataFrame
    """Each node's newest inventory record (``state/inventory.py`` columns, no time)."""


KEPT = ("JobName", "Account", "User", "Partition", "QOS", "Priority", "ExitCode", "State")
"""The columns a line keeps once read (the rest is in its other fields): a line held
every column, 2.3 kB a line, and a history's lines are all held at once."""


@dataclass(slots=True)
class _Line:
    row: dict[str, str]
    job_id: str
    state: str
    submit: datetime
    start: datetime | None
    end: datetime | None
    gpus: int
    gpu_type: str | None
    nodes: list[str]
    indices: list[tuple[str, int]] | None
    later: tuple[tuple[datetime, datetime | None, datetime | None], ...] = ()
    """Other readings of times in a repeated hour (DST end) that keep the line in order,
    each with one more time read as its second occurrence (:func:`_times`): for an
    attempt that, read as taken, begins before the one before it ended (:func:`_in_turn`)."""
    second: bool = False
    """Whether a time of the line is read as its second occurrence (counted once)."""


class _BadLine(Exception):
    """A line that is left out, with the reason (the rest of the file is imported)."""


def _parse(text: str, where: str, column: str) -> datetime | None:
    """The time as written (naive without an offset), ``None`` when not yet
    (``Unknown``). Text that is not a time stops the import (:class:`SacctError`); one
    written as a time is, of a day that does not exist, is a bad line."""
    text = text.strip()
    if text in _UNSET:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        impossible = not_a_date(text)
        if impossible is not None:  # written as a time is, of a day that does not exist
            raise _BadLine(f"{column} {text!r} {impossible}") from None
        raise SacctError(f"{where}: {column}: {text!r} is not a time (expected "
                         "2026-01-05T10:00:00)") from None


def _utc(value: datetime, tz: tzinfo, column: str, text: str, fold: int = 0) -> datetime:
    """``value`` in UTC: with an offset as given, without one read in ``tz`` (a time
    that occurs twice, at a fall-back, as its ``fold``: 0 the first occurrence). A local
    time that ``tz`` skips (spring-forward gap) is a bad line."""
    try:
        if value.tzinfo is None:
            local = value.replace(tzinfo=tz, fold=fold)
            if local.astimezone(UTC).astimezone(tz).replace(tzinfo=None) != value:
                raise _BadLine(f"{column} {text.strip()!r} " + (
                    clock_change(value, tz)
                    or f"does not exist in time zone {zone_name(tz)}"))
            value = local
        return value.astimezone(UTC)
    except OverflowError:  # year 1 or 9999 moved past the calendar's ends
        raise _BadLine(f"{column} {text.strip()!r} is out of range in UTC") from None


TIMES = ("Submit", "Start", "End")


_Times = tuple[datetime, datetime | None, datetime | None]


def _times(values: tuple[datetime, datetime | None, datetime | None], tz: tzinfo,
           row: dict[str, str]
           ) -> tuple[_Times, list[str], bool, tuple[_Times, ...]]:
    """A line's Submit, Start and End in UTC, the columns whose local time ``tz``
    repeats (the hour the clocks go back: each reads as the first occurrence, summer
    time, or the second), whether one was read as the second, and the later readings
    that keep the times in order too (for :func:`_in_turn`). Of the readings the one
    that keeps the times in order is taken, the first occurrence preferred, Submit's
    first (a job whose End is in winter time and Start in summer time, both written
    02:xx, ran for minutes, not minus forty). When no reading does, the first
    occurrences are given (:func:`_check_line` names the line)."""
    repeated = [] if tz is UTC else [
        c for c, v in zip(TIMES, values, strict=True)
        if v is not None and v.tzinfo is None and change_at(v, tz) == "repeated"]
    if not repeated:
        submit, start, end = (None if v is None else _utc(v, tz, c, row[c])
                              for c, v in zip(TIMES, values, strict=True))
        assert submit is not None
        return (submit, start, end), repeated, False, ()
    readings: list[tuple[_Times, bool]] = []
    for folds in itertools.product((0, 1), repeat=len(repeated)):
        fold = dict(zip(repeated, folds, strict=True))
        submit, start, end = (None if v is None else _utc(v, tz, c, row[c], fold.get(c, 0))
                              for c, v in zip(TIMES, values, strict=True))
        assert submit is not None
        readings.append(((submit, start, end), _out_of_order(submit, start, end) is None))
    ordered = [r for r, ok in readings if ok]
    if not ordered:
        return readings[0][0], repeated, False, ()
    taken = next(k for k, (_r, ok) in enumerate(readings) if ok)
    return ordered[0], repeated, taken > 0, tuple(ordered[1:])


def _gres_idx(text: str, nodes: list[str]) -> list[tuple[str, int]] | None:
    text = text.strip()
    if not text or text in _UNSET:
        return None
    out: list[tuple[str, int]] = []
    for part in text.split(";"):
        node, sep, idx = part.rpartition(":")
        if not sep:
            if len(nodes) != 1:
                return None
            node, idx = nodes[0], part
        out.extend((node, i) for i in expand_indices(idx))
    return out


def _check_tres(text: str) -> None:
    """GPU entries of a TRES string are whole ASCII numbers, each key once (what
    :func:`parse_tres_gpus` reads silently otherwise)."""
    seen: set[str] = set()
    for item in text.split(","):
        key, _, value = item.partition("=")
        if key != "gres/gpu" and not key.startswith("gres/gpu:"):
            continue
        if not re.fullmatch(r"[0-9]+", value):
            raise _BadLine(f"TRES {item!r}: the GPU count is not a whole number")
        if key in seen:
            raise _BadLine(f"TRES {text[:80]!r}: {key} appears twice")
        seen.add(key)


def _out_of_order(submit: datetime, start: datetime | None, end: datetime | None
                  ) -> tuple[str, str] | None:
    """The first two times out of order (``("End", "Start")``: End is before Start), or
    None."""
    if start is not None and start < submit:
        return "Start", "Submit"
    if end is not None and start is not None and end < start:
        return "End", "Start"
    if end is not None and end < submit:
        return "End", "Submit"
    return None


def _check_line(line: _Line, row: dict[str, str], repeated: Sequence[str] = (),
                tz: tzinfo = UTC) -> None:
    """The state is one the importer knows and the times are in order (the reason names
    the two times as the line has them, and ``repeated``, those in an hour ``tz``
    repeats, none of whose readings put them in order)."""
    if line.state not in KNOWN_STATES:
        raise _BadLine(f"State {line.row['State'].strip()!r} is not a job state the "
                       f"importer knows ({', '.join(KNOWN_STATES)})")
    wrong = _out_of_order(line.submit, line.start, line.end)
    if wrong is None:
        return
    later, earlier = wrong
    reason = f"{later} {row[later].strip()!r} is before {earlier} {row[earlier].strip()!r}"
    if repeated:
        change = clock_change(datetime.fromisoformat(row[repeated[0]].strip()), tz) or ""
        reason += (f", and no reading of the hour {zone_name(tz)} repeats puts the line's "
                   "times in order: "
                   + ", ".join(f"{c} {row[c].strip()!r}" for c in repeated)
                   + (" occurs" if len(repeated) == 1 else " occur") + " twice there"
                   + (f" ({change.partition(': ')[2]})" if ": " in change else ""))
    raise _BadLine(reason)


PROGRESS_LINES = 10_000
"""Lines read between two calls of the reading progress callback."""


def read_sacct(paths: Sequence[Path], tz: tzinfo = UTC,
               on_progress: Callable[[float], None] | None = None
               ) -> tuple[list[_Line], SacctImport]:
    """Parse the files into job lines (steps, CPU-only jobs, pending arrays left out),
    one per attempt (:func:`_one_line_per_attempt`).

    The import is refused whole (:class:`SacctError`, ``file:line: reason``) at the first
    unreadable line of any file: not UTF-8, a field over the CSV reader's limit, a file
    that ends inside a line, text that is not a time, a GPU count, index list or node list no
    cluster has. A job name holding ``|`` or a line break is read back whole (:func:`_records`;
    a record mended so that still does not read is a bad line: a job name is any
    user's to choose). A line that
    reads but says something impossible (an unknown state, times out of order, a date
    that does not exist, a local time the zone skips, a GPU count that is not a whole
    number or too large for its nodes, a malformed node list) is left out and listed in
    ``bad_lines``; a line identical to an earlier one is dropped and counted.
    ``on_progress`` gets the share of the files' bytes read (about: counted from the
    fields)."""
    result = SacctImport({}, files=len(paths))
    lines: list[_Line] = []
    seen: set[bytes] = set()
    total = max(sum(p.stat().st_size for p in paths), 1)
    done = 0

    def read(chars: int) -> None:
        if on_progress is not None:
            on_progress(min((done + chars) / total, 1.0))

    for path in paths:
        lines += _read_file(path, tz, result, seen, read)
        done += path.stat().st_size
        read(0)
    return _one_line_per_attempt(lines, result), result


def _one_line_per_attempt(lines: list[_Line], result: SacctImport) -> list[_Line]:
    """One line per attempt (job id and Submit), in the order read: of the lines of one
    attempt, the one with an End over those without, then one with a Start, then the
    last one read (a later export, or a record corrected since)."""
    best: dict[tuple[str, datetime], int] = {}
    for i, line in enumerate(lines):
        key = (line.job_id, line.submit)
        j = best.get(key)
        if j is None:
            best[key] = i
            continue
        result.attempts_merged += 1
        other = lines[j]
        if (line.end is not None, line.start is not None) >= \
                (other.end is not None, other.start is not None):
            best[key] = i
    return [lines[i] for i in sorted(best.values())]


def _is_header(values: list[str]) -> bool:
    """Whether a record is a header line (``cat`` of exports keeps each one's): it names
    three of the required columns or more (one that misses some is refused, naming
    them). No job line does: its times are times, its state a state; a job name is one
    field."""
    return len(set(REQUIRED) & set(values)) >= 3


def _checked_header(path: Path, number: int, header: list[str]) -> list[str]:
    missing = [c for c in REQUIRED if c not in header]
    if missing or not ({"AllocTRES", "ReqTRES"} & set(header)):
        need = missing + ([] if {"AllocTRES", "ReqTRES"} & set(header)
                          else ["AllocTRES or ReqTRES"])
        where = f"{path}" if number == 1 else f"{path}:{number}"
        raise SacctError(f"{where}: missing column(s) {', '.join(need)} in the header "
                         f"(got {'|'.join(header)}); export with sacct --parsable2 "
                         "--format ... (docs/import.md)")
    twice = sorted({c for c in header if c and header.count(c) > 1})
    if twice:
        raise SacctError(f"{path}:{number}: column(s) {', '.join(twice)} appear twice in "
                         "the header")
    return header


def _records(path: Path, header: list[str], rows: Iterator[tuple[int, list[str]]]
             ) -> Iterator[tuple[int, list[str], str | None, list[str]]]:
    """(line number, fields, why it was mended or None, the header they are under) of
    each record: a line cut short by a line break inside a free-text field is joined
    with the lines after it (the break kept in the field), and a record with more fields
    than the header, where the job name is the only free text, has the extra ones put
    back into it (``|`` between them). A record with more fields and other free text is
    yielded as it is: which field held the ``|`` cannot be told. A header line further
    down (exports joined with ``cat``) is the header of the lines after it.

    Refused (:class:`SacctError`, an export cut short or damaged): a file that ends
    inside a record, and a short line that cannot be a line break in free text: one
    whose last field comes before every free-text column, or one followed by a line that
    is a record of its own (as many fields as the header, or more: joined, its fields
    were another job's)."""
    width = len(header)
    free = [c for c in header if c in FREE_TEXT]
    name = header.index("JobName") if free == ["JobName"] else None
    for number, values in rows:
        if not values or values == [""]:
            continue
        if _is_header(values):
            if values != header:
                header = _checked_header(path, number, values)
                width = len(header)
                free = [c for c in header if c in FREE_TEXT]
                name = header.index("JobName") if free == ["JobName"] else None
            continue
        why = None
        while len(values) < width:
            more = next(rows, None)
            short = f"{path}:{number}: {len(values)} fields, the header has {width}"
            if more is None:
                raise SacctError(short)
            first_free = min((header.index(c) for c in free), default=width)
            # the next line a record of its own: as many fields as the header, and more
            # than the rest of this one takes (a job name first, broken after its first
            # piece, leaves a whole record's count to the next line: that is the rest)
            whole = len(more[1]) >= width and len(values) + len(more[1]) - 1 > width
            if len(values) - 1 < first_free or whole:
                raise SacctError(
                    f"{short}: a line cut short (line {more[0]} is "
                    + ("a record of its own)" if whole else
                       f"not the rest of it: the break is before "
                       f"{'the free-text columns' if free else 'any free-text column'})"))
            values = [*values[:-1], values[-1] + "\n" + (more[1] or [""])[0], *more[1][1:]]
            why = "a line break in a field"
        extra = len(values) - width
        if extra > 0 and name is not None:
            values = [*values[:name], "|".join(values[name:name + extra + 1]),
                      *values[name + extra + 1:]]
            why = "a '|' in the job name" if why is None else why + " and a '|' in the job name"
        yield number, values, why, header


def _read_file(path: Path, tz: tzinfo, result: SacctImport, seen: set[bytes],
               read: Callable[[int], None]) -> list[_Line]:
    rows = csv_rows(path, SacctError, delimiter="|", quoting=csv.QUOTE_NONE)
    first = next(rows, None)
    if first is None:
        raise SacctError(f"{path}: empty file")
    header = _checked_header(path, first[0], first[1])
    lines: list[_Line] = []
    named = repr(header)
    chars = 0
    for number, values, mended, under in _records(path, header, rows):
        if under is not header:
            header, named = under, repr(under)
        result.lines += 1
        chars += sum(map(len, values)) + len(values)
        if number % PROGRESS_LINES == 0:
            read(chars)
        # the same values under another header differ (reprs: unambiguous, whatever the
        # values hold); 16 bytes a line, not its text
        key = hashlib.blake2b((named + repr(values)).encode(), digest_size=16).digest()
        if key in seen:
            result.duplicates_dropped += 1
            continue
        seen.add(key)
        where = f"{path}:{number}"
        if len(values) > len(header):
            result.bad_lines.append((where, f"{len(values)} fields, the header has "
                                     f"{len(header)}: a '|' in a free-text column "
                                     f"({', '.join(c for c in header if c in FREE_TEXT)})"))
            continue
        if mended is not None:
            result.names_mended += 1
        row = dict(zip(header, values, strict=True))
        raw_id = row["JobID"]
        if "." in raw_id:
            result.steps_skipped += 1
            continue
        if "[" in raw_id:
            result.pending_arrays_skipped += 1
            continue
        try:
            for column in ("AllocTRES", "ReqTRES"):
                _check_tres(row.get(column) or "")
            _check_priority(row.get("Priority"))
            gpu_type, gpus = parse_tres_gpus(row.get("AllocTRES"))
            if not gpus:
                gpu_type, gpus = parse_tres_gpus(row.get("ReqTRES"))
            if gpus <= 0:
                result.cpu_only_skipped += 1
                continue
            submitted = _parse(row["Submit"], where, "Submit")
            if submitted is None:
                raise SacctError(f"{where}: Submit is empty")
            hostlist = row.get("NodeList", "").strip()
            if hostlist not in _NO_NODES and not HOSTLIST.fullmatch(hostlist):
                raise _BadLine(f"NodeList {hostlist[:80]!r} is not a host list "
                               "(e.g. gpu-[1-3,5],login1)")
            nodes = [sys.intern(n) for n in expand_hostlist(hostlist or None)]
            indices = _gres_idx(row.get("GresIDX", ""), nodes)
            per_node = -(-gpus // max(len(nodes), 1))
            if indices is None and nodes and per_node > MAX_GPUS_PER_NODE:
                raise _BadLine(f"{gpus:,} GPUs on {len(nodes):,} node(s) ({hostlist[:80]}): "
                               f"{per_node:,} on a node, more than a node can have "
                               f"({MAX_GPUS_PER_NODE:,})")
            (submit, start, end), repeated, second, later = _times(
                (submitted, _parse(row["Start"], where, "Start"),
                 _parse(row["End"], where, "End")), tz, row)
            line = _Line(
                # the same few accounts, users, partitions, states over and over: one
                # string object each (a history's lines are all held at once)
                row={k: sys.intern(row[k]) for k in KEPT if k in row},
                job_id=(row.get("JobIDRaw") or raw_id).strip() or raw_id,
                state=sys.intern(row["State"].split()[0].upper()) if row["State"].strip()
                else "",
                submit=submit, start=start, end=end, gpus=gpus, gpu_type=gpu_type,
                nodes=nodes, indices=indices, later=later, second=second)
            _check_line(line, row, repeated, tz)
        except (SlurmParseError, SacctError) as exc:
            reason = str(exc).removeprefix(f"{where}: ")
            if mended is None:
                raise SacctError(f"{where}: {reason}") from None
            # a record mended across a '|' or a line break that still does not read is
            # left out, not the whole import: a job name is any user's to choose
            result.bad_lines.append((where, f"{reason} (read with {mended})"))
            continue
        except _BadLine as exc:
            result.bad_lines.append((where, str(exc)))
            continue
        if repeated:
            result.repeated_hour += 1
            result.repeated_hour_second += second
        lines.append(line)
    return lines


def _check_priority(text: str | None) -> None:
    """A Priority that is a whole number fits the events' 64-bit column (Slurm's is
    32-bit); any other text is read as none (:func:`_int`)."""
    value = _int(text)
    if value is not None and not -2**63 <= value < 2**63:
        raise _BadLine(f"Priority {text.strip()[:40]!r} is out of range"  # type: ignore[union-attr]
                       " (a 64-bit whole number)")


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text and text.strip() else None
    except ValueError:
        return None


def _slurm_job(attempts: list[_Line]) -> SlurmJob:
    """The job as its last line has it, with the card type of the last line that names
    one (a job pending again after a requeue has no typed ``AllocTRES``)."""
    line, row = attempts[-1], attempts[-1].row
    gpu_type = next((a.gpu_type for a in reversed(attempts) if a.gpu_type), None)
    return SlurmJob(job_id=line.job_id, state=line.state, name=row.get("JobName", ""),
                    user=row.get("User") or None, account=row.get("Account") or None,
                    partition=row.get("Partition") or None, qos=row.get("QOS") or None,
                    priority=_int(row.get("Priority")), gpus=line.gpus, gpu_type=gpu_type)


def load_sacct(paths: Sequence[Path], mapping: Mapping | None = None,
               nodes_file: Path | None = None, tz: tzinfo = UTC,
               on_progress: Callable[[float], None] | None = None,
               history: History | None = None) -> SacctImport:
    """Read ``sacct -P`` exports (one history) and turn them into inventory and job event
    frames (``on_progress``: the share of the files read). ``history``: what the
    warehouse holds where this import goes on from it (:func:`_after_history`)."""
    return read_exports(paths, nodes_file, tz, on_progress).events(mapping, history)


def read_exports(paths: Sequence[Path], nodes_file: Path | None = None, tz: tzinfo = UTC,
                 on_progress: Callable[[float], None] | None = None) -> Exports:
    """Read the exports and the ``--nodes`` file (:class:`SacctError` at the first
    unreadable line, before anything is written)."""
    lines, result = read_sacct(paths, tz, on_progress)
    known: list[SlurmNode] = []
    try:
        if nodes_file is not None:
            known = parse_scontrol_nodes(nodes_file.read_text(encoding="utf-8"))
            if not known:  # it was passed over, and the inventory inferred, in silence
                raise ValueError("no node in it (no NodeName=…): is it `scontrol -o show "
                                 "node -d` output?")
        placer = Placer({n.name: n.gpus for n in known if n.gpus > 0})
    except UnicodeDecodeError:
        raise SacctError(f"{nodes_file}: not UTF-8 text") from None
    except ValueError as exc:  # SlurmParseError, or a node with more GPUs than any
        raise SacctError(f"{nodes_file}: {exc}") from None
    return Exports(lines, result, known, placer)


@dataclass
class Exports:
    """Exports read: their attempts' lines, what was left out, the ``--nodes`` file's
    nodes and the placement of GPUs over them."""

    lines: list[_Line]
    result: SacctImport
    nodes: list[SlurmNode]
    placer: Placer

    def events(self, mapping: Mapping | None = None, history: History | None = None
               ) -> SacctImport:
        """The inventory and job event frames (going on from ``history`` when given;
        once: the lines are let go, so that they are not held while the events are
        processed, and the counts are the result's)."""
        lines, self.lines = self.lines, []
        return _events(lines, self.result, mapping or Mapping(), self.nodes, self.placer,
                       history)


def _events(lines: list[_Line], result: SacctImport, mapping: Mapping,
            known: list[SlurmNode], placer: Placer, history: History | None
            ) -> SacctImport:
    result.went_on_from = history.closed if history is not None else None
    by_job: dict[str, list[_Line]] = defaultdict(list)
    for line in lines:
        by_job[line.job_id].append(line)
    result.jobs = len(by_job)
    if history is not None:
        result.running_missing = sorted(j for j in history.running if j not in by_job)

    # events without allocations yet: (time, order, job, event, fields)
    events: list[tuple[datetime, int, str, str, dict[str, Any]]] = []
    runs: list[tuple[datetime, datetime | None, str, _Line]] = []  # attempts that ran
    # jobs with the same attributes (team, user, queue, size, ...) share one dict: a
    # dict per job took 110 MB for 14 days of a 10,240-GPU cluster (never changed after)
    shared: dict[tuple[tuple[str, Any], ...], dict[str, Any]] = {}
    for job_id, attempts in by_job.items():
        attempts.sort(key=lambda a: a.submit)
        if len(attempts) > 1 and any(a.later for a in attempts):
            _in_turn(attempts, result)
        attrs = job_attributes(mapping, _slurm_job(attempts))
        attrs = shared.setdefault(tuple(attrs.items()), attrs)
        job_events = [(attempts[0].submit, 0, job_id, "submitted", attrs)]
        job_runs = []
        for k, a in enumerate(attempts):
            result.attempts += 1
            following = attempts[k + 1] if k + 1 < len(attempts) else None
            if a.start is not None and a.start >= a.submit and a.state != "PENDING" \
                    and not (a.state == "CANCELLED" and a.end is not None
                             and a.end <= a.start):
                job_runs.append((a.start, _attempt_end(a, following), job_id, a))
                job_events.append((a.start, 2, job_id, "started", attrs))
            job_events.extend(_ends(job_id, a, following))
        if history is not None:
            job_events, job_runs = _after_history(history, job_id, job_events, job_runs,
                                                  result)
        events += job_events
        runs += job_runs
    return _assemble(result, events, runs, mapping, known, placer, history)


def _in_turn(attempts: list[_Line], result: SacctImport) -> None:
    """Read a requeued job's times in a repeated hour (DST end) so that its attempts
    come one after another: each line read alone takes the first occurrence where its
    own times keep their order, so an attempt submitted again at 02:10 winter time,
    after one that ended at 02:50 summer time, was read as starting 40 minutes before
    that end (the first attempt cut short, the second charged an hour more: GPU-hours
    invented). An attempt that, as read, is submitted before the one before it ended is
    read in the first of its other orderly readings that comes after that end; counted
    with the lines read as the second occurrence. In Submit order, sorted again."""
    for k in range(1, len(attempts)):
        a, before = attempts[k], attempts[k - 1]
        end = before.end if before.end is not None else before.start
        if end is None or a.submit >= end:
            continue
        fits = next((r for r in a.later if r[0] >= end), None)
        if fits is not None:
            a.submit, a.start, a.end = fits
            a.later = ()
            result.repeated_hour_second += not a.second
            a.second = True
    attempts.sort(key=lambda a: a.submit)


def _after_history(history: History, job_id: str,
                   events: list[tuple[datetime, int, str, str, dict[str, Any]]],
                   runs: list[tuple[datetime, datetime | None, str, _Line]],
                   result: SacctImport
                   ) -> tuple[list[tuple[datetime, int, str, str, dict[str, Any]]],
                              list[tuple[datetime, datetime | None, str, _Line]]]:
    """A job's events and runs going on from ``history``: the events it took already
    (and a known job's submission) are left out, counted; the attempt it holds running
    keeps the GPUs it was given there, and those of its attempts that ended are not
    placed again. A job it does not know that was over before ``history.forgets_before``
    is left out, counted (``jobs_before``: the book forgets ended jobs, so it cannot be
    told from one of the history's). A job it does not know that was only submitted
    before ``history.closed`` is taken, counted (``ineligible_before``: sacct printed it
    in no earlier window, as it was not eligible to run). Any other job with events
    before ``history.closed`` that it did not take (not in the earlier exports, or told
    otherwise there) is named in ``unknown_before``."""
    seen = history.seen.get(job_id)
    if seen is None:
        if all(e[0] < history.forgets_before for e in events):
            # over before the history's book forgets ended jobs: exports that overlap
            result.events_before += len(events)
            result.jobs_before += 1
            return [], []
        if any(e[0] < history.closed and e[3] != "submitted" for e in events):
            result.unknown_before.append(job_id)
        elif events[0][0] < history.closed:
            # submitted before the history's end but never printed there: sacct prints a
            # job only once it is eligible (held, waiting on a dependency or a begin time)
            result.ineligible_before += 1
        return events, runs
    kept = [e for e in events if (e[3], e[0]) not in seen and e[3] != "submitted"]
    result.events_before += len(events) - len(kept)
    if any(e[0] < history.closed for e in kept):
        result.unknown_before.append(job_id)
    held = history.running.get(job_id)
    kept_runs = []
    for start, end, _job, a in runs:
        if ("started", start) not in seen:
            kept_runs.append((start, end, _job, a))
        elif held is not None and start == held[0]:
            # the GPUs the history gave it (its start is the history's: not sent again)
            a.indices = [(node, index) for node, index, _f in held[1]]
            kept_runs.append((start, end, _job, a))
    return kept, kept_runs


def _attempt_end(a: _Line, following: _Line | None) -> datetime | None:
    """When an attempt ends: at its End (Slurm sets End to the requeue time and writes
    the next attempt's Submit only after the epilog), or, with no End, at the next
    attempt's Submit; never after the next attempt's Start (attempts do not overlap)."""
    if following is None:
        return a.end
    end = a.end if a.end is not None else following.submit
    if following.start is not None and following.start < end \
            and (a.start is None or a.start <= following.start):
        end = following.start
    return end


def _ends(job_id: str, a: _Line, following: _Line | None
          ) -> list[tuple[datetime, int, str, str, dict[str, Any]]]:
    out: list[tuple[datetime, int, str, str, dict[str, Any]]] = []
    end = _attempt_end(a, following)
    if a.state == "PREEMPTED" and a.end is not None and end is not None:
        out.append((end, 1, job_id, "preempted", {"reason": "preempted by Slurm"}))
        if following is None:
            out.append((end, 1, job_id, "cancelled", {"reason": "preempted and not "
                                                                "requeued"}))
    if following is not None and end is not None:
        out.append((end, 1, job_id, "requeued",
                    {"reason": f"requeued by Slurm ({a.state.lower()})"}))
        return out
    if a.state == "REQUEUED" and a.end is not None:
        # the last attempt known was requeued at End: the job waits again (pending)
        out.append((a.end, 1, job_id, "requeued", {"reason": "requeued by Slurm"}))
        return out
    if a.end is None or a.state in ("PENDING", "RUNNING", "PREEMPTED", "SUSPENDED"):
        return out
    exit_code = a.row.get("ExitCode", "").strip()
    if a.state == "COMPLETED":
        out.append((a.end, 1, job_id, "finished", {}))
    elif a.state == "CANCELLED":
        out.append((a.end, 1, job_id, "cancelled", {"reason": a.row["State"].strip().lower()}))
    else:
        out.append((a.end, 1, job_id, "failed", {
            "reason": a.state.lower() + (f" (exit code {exit_code})" if exit_code else "")}))
    return out


def _assemble(result: SacctImport,
              events: list[tuple[datetime, int, str, str, dict[str, Any]]],
              runs: list[tuple[datetime, datetime | None, str, _Line]], mapping: Mapping,
              known: list[SlurmNode], placer: Placer, history: History | None = None
              ) -> SacctImport:
    allocation: dict[int, list[tuple[str, int, float]]] = {}
    held: dict[str, int] = defaultdict(int)
    peak: dict[str, int] = defaultdict(int)
    if history is not None:
        # attempts the history holds running that no line here goes on with keep their
        # GPUs (those with a line are placed where the history had them, at their start:
        # the runs kept from before its end, :func:`_after_history`)
        going_on = {job_id for start, _e, job_id, _a in runs if start < history.closed}
        for job_id, (_start, slots) in history.running.items():
            if job_id not in going_on:
                placer.take(slots)
                for node, _idx, _f in slots:
                    held[node] += 1
                    peak[node] = max(peak[node], held[node])
    # place the attempts in time order, releases first at the same instant
    timeline: list[tuple[datetime, int, int]] = []
    for i, (start, end, _job, _a) in enumerate(runs):
        timeline.append((start, 1, i))
        if end is not None:
            timeline.append((end, 0, i))
    timeline.sort()
    for _t, kind, i in timeline:
        _start, _end, job_id, a = runs[i]
        if kind == 0:
            for node, _idx, _f in allocation.get(i, []):
                held[node] -= 1
            placer.release(allocation.get(i, []))
            continue
        if a.indices is not None:
            slots = [(n, idx, 1.0) for n, idx in a.indices]
            placer.take(slots)
        else:
            slots = []
            nodes = a.nodes or []
            per_node, extra = divmod(a.gpus, max(len(nodes), 1))
            for j, node in enumerate(nodes):
                got = placer.place_on(node, per_node + (1 if j < extra else 0), grow=True)
                slots.extend(got or [])
            result.placed_by_importer += bool(nodes)
        if not slots:
            result.unplaced.append(job_id)
        allocation[i] = slots
        for node, _idx, _f in slots:
            held[node] += 1
            peak[node] = max(peak[node], held[node])

    started_at: dict[tuple[str, datetime], int] = {
        (job_id, start): i for i, (start, _e, job_id, _a) in enumerate(runs)}
    jobs = _JobColumns()
    for when, _order, job_id, event, fields in sorted(events, key=lambda e: (e[0], e[1], e[2])):
        placed = None
        if event == "started":
            placed = allocation.get(started_at[(job_id, when)], [])
            if not placed:
                continue  # no node list: nothing to say where it ran
        jobs.add(when, event, job_id, fields, placed)
    del events

    # the inventory holds from the first event validation accepts: a time before 2000
    # (rejected, counted) must not take every node's record with it
    first = min((t for t in jobs.times if t >= MIN_TIME), default=datetime.now(UTC))
    if history is not None:  # the history's inventory holds until there
        first = max(first, history.closed)
        for node, gpus in zip(history.inventory["node"], history.inventory["gpu_count"],
                              strict=True):
            if node in peak and gpus is not None:
                peak[node] = max(peak[node], gpus)
    inventory = [{"time": first, **node_record(mapping, n)} for n in known if n.gpus > 0]
    listed = {n.name for n in known}
    seen_nodes: dict[str, tuple[int, str | None, str | None]] = {}
    for i, (_s, _e, _job, a) in enumerate(runs):
        for node, idx, _f in allocation.get(i, []):
            gpus, gtype, part = seen_nodes.get(node, (0, None, None))
            seen_nodes[node] = (max(gpus, idx + 1, peak[node]), gtype or a.gpu_type,
                                part or a.row.get("Partition") or None)
    for node, (gpus, gtype, part) in sorted(seen_nodes.items()):
        if node in listed:
            continue
        result.nodes_inferred.append(node)
        record = node_record(mapping, SlurmNode(name=node, state="idle",
                                                partitions=(part,) if part else (),
                                                gpu_type=gtype, gpus=gpus))
        record["labels"] = {"source": "inferred from sacct"}
        inventory.append({"time": first, **record})
    for record in inventory:
        record["labels"] = json.dumps(record.get("labels") or {}, separators=(",", ":"))
    # an empty list still needs its columns: a frame without any would be one null row
    inv = conform(pl.DataFrame(inventory or {"time": [], "node": []},
                               infer_schema_length=None).with_columns(
        pl.lit(1).alias("v"), pl.lit("inventory").alias("type")), "inventory")
    if history is not None:  # a node as the history has it already is not sent again
        inv = _changed(inv, history.inventory)
        sent = set(inv["node"])
        result.nodes_inferred = [n for n in result.nodes_inferred if n in sent]
    result.frames = {"inventory": inv, "job": jobs.frame()}
    return result


def _changed(inventory: pl.DataFrame, newest: pl.DataFrame) -> pl.DataFrame:
    """The records of ``inventory`` that differ from their node's ``newest`` record."""
    same = [c for c in newest.columns if c != "unhealthy_gpus"]

    def listed(frame: pl.DataFrame) -> pl.DataFrame:
        return frame.with_columns(pl.col("unhealthy_gpus").cast(pl.List(pl.String))
                                  .list.join(",").fill_null("").alias("_unhealthy"))

    return listed(inventory).join(listed(newest).select(*same, "_unhealthy"),
                                  on=[*same, "_unhealthy"], how="anti",
                                  nulls_equal=True).drop("_unhealthy")


class _JobColumns:
    """Job events gathered as columns (time, event, job, a reference to the event's
    fields) and the allocations as flat columns, made into the frame at the end: a frame
    built from a dict per event (each with a list of dicts) took 870 MB more at its peak
    than the frame holds, for two weeks of a 10,240-GPU cluster."""

    def __init__(self) -> None:
        self.times: list[datetime] = []
        self.events: list[str] = []
        self.job_ids: list[str] = []
        self.fields: list[dict[str, Any]] = []
        """Each event's fields: a job's attributes are one dict its events share."""
        self.alloc: dict[str, list[Any]] = {"row": [], "node": [], "gpu_index": [],
                                            "fraction": []}

    def add(self, when: datetime, event: str, job_id: str, fields: dict[str, Any],
            slots: list[tuple[str, int, float]] | None) -> None:
        row = len(self.times)
        self.times.append(when)
        self.events.append(event)
        self.job_ids.append(job_id)
        self.fields.append(fields)
        for node, index, fraction in slots or ():
            self.alloc["row"].append(row)
            self.alloc["node"].append(node)
            self.alloc["gpu_index"].append(index)
            self.alloc["fraction"].append(fraction)

    def frame(self) -> pl.DataFrame:
        """The contract's job frame (the event order kept). The columns gathered are
        emptied as they become Series."""
        schema = schema_of("job")
        alloc_type = schema["allocation"]
        columns = [pl.Series("time", self.times, dtype=schema["time"]),
                   pl.Series("event", self.events, dtype=pl.String),
                   pl.Series("job_id", self.job_ids, dtype=pl.String)]
        self.times, self.events, self.job_ids = [], [], []
        names = dict.fromkeys(name for fields in self.fields for name in fields)
        columns += [pl.Series(name, [f.get(name) for f in self.fields], dtype=schema[name])
                    for name in names if name in schema]
        self.fields = []
        frame = pl.DataFrame(columns).with_row_index("_row")
        del columns
        if self.alloc["row"]:
            flat = pl.DataFrame({name: pl.Series(name, self.alloc[name], dtype=dtype)
                                 for name, dtype in (("row", pl.UInt32), ("node", pl.String),
                                                     ("gpu_index", pl.Int64),
                                                     ("fraction", pl.Float64))})
            self.alloc = {}
            held = flat.group_by("row", maintain_order=True).agg(
                pl.struct("node", "gpu_index", pl.lit(None, pl.String).alias("gpu_uuid"),
                          "fraction").alias("allocation"))
            frame = frame.join(held.with_columns(pl.col("allocation").cast(alloc_type)),
                               left_on="_row", right_on="row", how="left",
                               maintain_order="left")
        return conform(frame.drop("_row").with_columns(
            pl.lit(1).alias("v"), pl.lit("job").alias("type")), "job")
