"""``gpuledger import slurm-sacct FILE...``: Slurm accounting history into the warehouse.

Lean at import time: the pipeline (Polars, DuckDB) is loaded only when the command runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuledger.cli.arguments import add_replace, print_bad, whole_count
from gpuledger.cli.errors import CliError, check_input_files
from gpuledger.local_time import change_at, clock_change, not_a_date


def _timezone(text: str) -> Any:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        raise argparse.ArgumentTypeError(f"--tz: unknown time zone {text!r} "
                                         "(e.g. UTC, Europe/Berlin)") from None


def _until(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        impossible = not_a_date(text)
        raise argparse.ArgumentTypeError(
            f"--until: {text!r} " + (impossible or "is not a time (expected "
                                     "2026-01-06T00:00:00, as sacct's --endtime)")) from None


def _until_utc(args: argparse.Namespace) -> datetime | None:
    """``--until`` in UTC (read in ``--tz`` without an offset), down to its minute; not
    after now."""
    if args.until is None:
        return None
    until: datetime = args.until
    if until.tzinfo is None:
        if args.tz is not None:
            # a local time the zone skips or repeats names no one instant: refused, as a
            # line's is left out (a skipped one read as the hour after, before 2026-12-07)
            change = clock_change(until, args.tz)
            first, second = (until.replace(tzinfo=args.tz, fold=f) for f in (0, 1))
            if change is not None and change_at(until, args.tz) == "skipped":
                raise CliError(f"--until {args.until.isoformat()} {change}; give a time "
                               "that exists, or one with its offset")
            if change is not None:
                raise CliError(f"--until {args.until.isoformat()} {change}; give it with "
                               f"its offset: {first.isoformat()} (the first, "
                               f"{first.tzname()}) or {second.isoformat()} (the second, "
                               f"{second.tzname()})")
        until = until.replace(tzinfo=args.tz or UTC)
    until = until.astimezone(UTC).replace(second=0, microsecond=0)
    if until > datetime.now(UTC):
        raise CliError(f"--until {args.until.isoformat()}: after now (the export's "
                       "--endtime, a time that has passed)")
    from gpuledger.pipeline.validate import MIN_TIME  # run time: the command loads it

    if until < MIN_TIME:
        # no event is older: every line would go into the job book, and nothing be
        # written, exit 0 (a probe)
        raise CliError(f"--until {args.until.isoformat()}: before "
                       f"{MIN_TIME:%Y-%m-%d} (no event is older; the export's --endtime)")
    return until


UTC_NAMES = frozenset({
    "", "UTC", "UTC0", "UTC+0", "UTC-0", "UCT", "GMT", "GMT0", "GMT+0", "GMT-0", "Z",
    "ZULU", "UNIVERSAL", "GREENWICH", "ETC/UTC", "ETC/UCT", "ETC/GMT", "ETC/GMT0",
    "ETC/GMT+0", "ETC/GMT-0", "ETC/UNIVERSAL", "ETC/ZULU", "ETC/GREENWICH"})
"""``TZ`` values that name UTC (``:UTC`` and ``/usr/share/zoneinfo/UTC`` as well)."""


def _tz_warning(tz: Any, environ: Any) -> str | None:
    """The warning when no ``--tz`` is given but ``$TZ`` names a zone other than UTC: a
    site that runs sacct and the import on one host in its own zone has its times read as
    UTC, hours off, unless it says so."""
    text = environ.get("TZ")
    if tz is not None or text is None:
        return None
    name = text.strip().removeprefix(":").rpartition("zoneinfo/")[2]
    if name.upper() in UTC_NAMES:
        return None
    try:
        _timezone(name)
        hint = f"--tz {name}"
    except argparse.ArgumentTypeError:
        hint = "--tz ZONE (e.g. Europe/Berlin)"
    return (f"gpuledger: warning: TZ is {text!r}, but times without an offset (in the "
            f"exports and --until) are read as UTC, not as $TZ: pass {hint} if sacct "
            "printed them there")


def cmd_import_slurm_sacct(args: argparse.Namespace) -> int:
    from gpuledger.cli.main import _need_pipeline, _proc_config, _progress

    _need_pipeline()
    from gpuledger.bridges.mapping import MappingError, load_mapping
    from gpuledger.pipeline.continued_import import import_exports
    from gpuledger.pipeline.demo import check_not_demo
    from gpuledger.pipeline.importers.slurm_sacct import SacctError, read_exports
    from gpuledger.pipeline.ingest import file_digest
    from gpuledger.pipeline.processor import Processor
    from gpuledger.pipeline.warehouse import Warehouse

    check_input_files(*args.file, args.nodes)
    check_not_demo(args.warehouse)
    seen: dict[Path, Path] = {}
    for name in args.file:
        first = seen.setdefault(name.resolve(), name)
        if first is not name:
            same = "is named twice" if first == name else f"and {name} are the same file"
            raise CliError(f"{first} {same}: name each export once")
    try:
        mapping = load_mapping(args.mapping)
    except MappingError as exc:
        raise CliError(f"mapping: {exc}") from None
    warning = _tz_warning(args.tz, os.environ)
    if warning is not None:
        print(warning, file=sys.stderr)
    until = _until_utc(args)
    try:
        with _progress("reading sacct", not args.quiet) as read:
            exports = read_exports(args.file, args.nodes, args.tz or UTC, read)
    except SacctError as exc:
        raise CliError(str(exc)) from None
    config = _proc_config(args)
    if not exports.lines and not _holds_slurm_history(args.warehouse):
        # as `import pods` says of a list without a pod; the warehouse is not opened (a
        # history to go on from is: an empty export there may be a day's gap, refused).
        # Without a job, an export has no time: --until alone has no start to close from
        r = exports.result
        print(f"nothing to import: {_names(args.file)} "
              f"{'holds' if len(args.file) == 1 else 'hold'} no GPU job ({r.lines:,} "
              f"lines, {r.steps_skipped:,} step lines, {r.cpu_only_skipped:,} CPU-only "
              f"jobs, {len(r.bad_lines):,} bad); {args.warehouse}/ is left as it was",
              file=sys.stderr)
        print_bad(r.bad_lines, args.show_bad, "bad lines")
        return 0
    processor = Processor(config, Warehouse(args.warehouse, options=config.warehouse))
    with _progress("importing sacct", not args.quiet) as update:
        imported, rejected = import_exports(
            processor, [file_digest(f) for f in args.file],
            lambda history: exports.events(mapping, history), update, replace=args.replace,
            until=until)
    r = imported
    print("slurm-sacct: " + (f"{r.files:,} files, " if r.files > 1 else "")
          + f"{r.lines:,} lines: {r.jobs:,} GPU jobs ({r.attempts:,} attempts) "
          f"imported into {args.warehouse}/; skipped {r.steps_skipped:,} step lines, "
          f"{r.cpu_only_skipped:,} CPU-only jobs, {r.pending_arrays_skipped:,} pending array "
          "ranges"
          + (f", {r.duplicates_dropped:,} repeated identical line(s) dropped"
             if r.duplicates_dropped else "")
          + (f", {len(r.bad_lines):,} bad line(s)" if r.bad_lines else "")
          + ("; times without an offset read as UTC (--tz to change)" if args.tz is None
             else f"; times without an offset read in {args.tz.key}")
          + (f"; {r.repeated_hour:,} line(s) with times in a repeated hour (DST end), "
             "read as the first occurrence"
             + (f", {r.repeated_hour_second:,} of them with the second where the first put "
                "the line's times out of order" if r.repeated_hour_second else "")
             if r.repeated_hour else "")
          + (f"; {r.names_mended:,} line(s) whose job name held a '|' or a line break, "
             "read back whole" if r.names_mended else "")
          + (f"; {r.attempts_merged:,} attempt(s) in more than one line (the line that "
             "knows most taken)" if r.attempts_merged else "")
          + f"; GPU indices chosen by the importer for {r.placed_by_importer:,} attempts"
          + (f"; {len(r.unplaced):,} started without a node list (e.g. "
             f"{', '.join(r.unplaced[:5])})" if r.unplaced else "")
          + (f"; inventory inferred for {len(r.nodes_inferred):,} nodes (pass --nodes)"
             if r.nodes_inferred else "")
          + (f"; {rejected:,} event(s) rejected (SELECT * FROM rejects)" if rejected else ""))
    if r.unchanged:
        print(f"nothing in these exports that the Slurm history in {args.warehouse}/ did "
              f"not hold already: it is unchanged (the next export goes on from "
              f"{r.went_on_from:%Y-%m-%d %H:%M} UTC)")
    elif r.went_on_from is not None:
        print(f"went on from the Slurm history in {args.warehouse}/, which ended at "
              f"{r.went_on_from:%Y-%m-%d %H:%M} UTC: {r.events_before:,} event(s) of its "
              "jobs before then taken from it"
              + (f" ({r.jobs_before:,} job(s) over before then that it no longer "
                 "remembers, taken as its own: exports that overlap)"
                 if r.jobs_before else "")
              + (f"; {r.ineligible_before:,} job(s) submitted before then that no earlier "
                 "export printed (held, or waiting on a dependency or a begin time: sacct "
                 "prints a job once it is eligible), taken from their submission"
                 if r.ineligible_before else ""))
    if r.events_after_until and until is not None:
        print(f"{r.events_after_until:,} event(s) at or after --until "
              f"{until:%Y-%m-%d %H:%M} UTC: taken into the job book, their minutes closed "
              "by the next import")
    print_bad(r.bad_lines, args.show_bad, "bad lines")
    return 0


def _names(files: list[Path]) -> str:
    return ", ".join(str(f) for f in files[:3]) + (f" and {len(files) - 3:,} more"
                                                  if len(files) > 3 else "")


def _holds_slurm_history(location: Any) -> bool:
    """Whether the warehouse at ``location`` holds a state an import goes on from
    (reached without creating anything: a missing folder holds none)."""
    from gpuledger.pipeline.continued_import import SACCT_STATES
    from gpuledger.pipeline.ingest import saved_states
    from gpuledger.pipeline.store import StoreError, open_store

    try:
        return bool(saved_states(open_store(location, create=False).child(SACCT_STATES)))
    except StoreError:
        return True  # unreadable: the import opens it and says why


def register(fmt: Any, common: Any) -> None:
    q = fmt.add_parser(
        "slurm-sacct", help="Slurm accounting history (sacct --parsable2 output)",
        description="Import `sacct --allusers --duplicates --parsable2 --format ...` output "
        "(columns in docs/import.md): steps skipped, array tasks as jobs, one attempt per "
        "line with requeues and preemptions, running jobs left running. GPU indices come "
        "from a GresIDX column when present, else the importer places inside each job's "
        "node list. Several exports (daily, monthly) are read as one history. Today's "
        "export alone goes on from where the warehouse's Slurm history ends (each import "
        "saves its state there): jobs running at the cut go on with their GPUs; an export "
        "that starts after that end (a day's export missing: a job running there is not "
        "in it) is refused. Importing every export again replaces the hours the earlier "
        "imports wrote, without --replace (docs/import.md).")
    q.add_argument("file", type=Path, nargs="+",
                   help="sacct -P output (header line first); several files (daily or "
                   "monthly exports, whose windows may overlap) are one history: an "
                   "attempt printed in more than one is taken from the line that knows "
                   "most (its end over none)")
    q.add_argument("--nodes", type=Path, default=None, metavar="FILE",
                   help="`scontrol -o show node -d` output for the inventory (default: "
                   "inferred from the jobs' node lists)")
    q.add_argument("--mapping", type=Path, default=None, metavar="FILE",
                   help="mapping file: account → team, partition → pool, ... "
                   "(docs/mapping.md); default: identity")
    q.add_argument("--tz", type=_timezone, default=None, metavar="ZONE",
                   help="time zone of times without an offset (default UTC; sacct prints "
                   "local time, so export with TZ=UTC or pass the cluster's zone)")
    q.add_argument("--until", type=_until, default=None, metavar="TIME",
                   help="the exports' end (sacct's --endtime, read in --tz without an "
                   "offset, down to its minute): the facts are closed up to it, so a day's "
                   "import holds the whole day, and the next export goes on from there "
                   "(default: the newest event read)")
    q.add_argument("--show-bad", type=whole_count("--show-bad"), default=20, metavar="N",
                   help="print at most N bad lines (default 20)")
    common(q)
    add_replace(q)
    q.set_defaults(func=cmd_import_slurm_sacct)
