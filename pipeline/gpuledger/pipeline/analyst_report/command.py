"""``gpuledger report``: registered through ``COMMAND_MODULES`` (no heavy imports here)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from gpuledger.cli.arguments import (
    READ_WAREHOUSE_HELP,
    TERMINAL_COLUMNS_MIN,
    iso_time,
    positive,
    terminal_width,
    time_limit,
)
from gpuledger.cli.errors import CliError
from gpuledger.output_file import replace_text


def cmd_report(args: argparse.Namespace) -> int:
    try:
        import duckdb
        from rich.console import Console
    except ImportError:
        raise CliError(
            "this command needs the pipeline extra: pip install 'gpuledger[pipeline]'"
        ) from None
    from gpuledger.pipeline.analyst_report.answers import answer_all
    from gpuledger.pipeline.analyst_report.html import render_html
    from gpuledger.pipeline.analyst_report.terminal import print_report
    from gpuledger.pipeline.query import QueryError

    if args.since and args.until and args.since >= args.until:
        raise CliError("--since must be before --until")
    try:
        report = answer_all(args.warehouse, args.since, args.until,
                            timeout_s=args.timeout)
        if args.whatif:
            from gpuledger.pipeline.advisor.history import HistoryError
            from gpuledger.pipeline.advisor.wiring import whatif_answer

            try:
                report.answers.append(whatif_answer(args.warehouse, args.since, args.until))
            except HistoryError as exc:
                raise CliError(f"--whatif: {exc}") from None
    except QueryError as exc:  # says which warehouse where it matters
        raise CliError(str(exc)) from None
    except duckdb.Error as exc:
        raise CliError(f"{args.warehouse}: {exc}") from None
    to_stdout = args.html is not None and str(args.html) == "-"
    if args.html is not None:
        text = render_html(report, str(args.warehouse),
                           datetime.now(UTC).replace(microsecond=0), args.top)
        if to_stdout:  # (it wrote a file named '-')
            sys.stdout.write(text)
            sys.stdout.flush()
            return 0
        try:
            replace_text(args.html, text)
        except OSError as exc:
            raise CliError(f"cannot write {args.html}: {exc.strerror}") from None
        charts = text.count('<div class="chart"')
        print(f"wrote {args.html} ({len(text.encode()):,} bytes, {charts} charts)",
              file=sys.stderr)
    if not args.quiet or args.html is None:
        print_report(report, Console(width=args.width), args.top)
    return 0


def _html_file(text: str) -> Path:
    """``--html``: a local file, or ``-`` (an s3:// URL was written as a local path,
    'cannot write s3:/bucket/r.html: No such file or directory')."""
    from gpuledger.pipeline.location import is_url

    if is_url(text):
        raise argparse.ArgumentTypeError(
            f"--html writes a local file, got a URL ({text}): write it here and copy it "
            "to the bucket")
    return Path(text)


def register(subparsers: argparse._SubParsersAction,  # type: ignore[type-arg]
             common: Callable[..., None]) -> None:
    p = subparsers.add_parser(
        "report", help="answer the key questions from the warehouse (tables, or HTML)",
        description="Answer the seed's questions from the warehouse: where the GPUs go "
        "(allocation vs use by pool and card type), who wastes (idle and inefficient "
        "GPU-hours by team and job type, top wasting jobs), why big jobs wait "
        "(fragmentation over time, queue wait by job size and queue, blocked demand and "
        "blocked jobs), where memory is over-asked, what preemption cost (lost work, "
        "borrowing and reclaim), and what to do (recommendations). Prints tables; "
        "--html FILE also writes one self-contained HTML file with charts (works "
        "offline). Times are UTC. The SQL behind each section is in "
        "pipeline/gpuledger/pipeline/analyst_report/sections.py, over the views of "
        "sql/20_analyst.sql (docs/analyst-guide.md).")
    p.add_argument("--warehouse", default=None, metavar="PATH|s3://BUCKET/PREFIX",
                   help=READ_WAREHOUSE_HELP)
    p.add_argument("--html", type=_html_file, default=None, metavar="FILE",
                   help="also write the report as a self-contained HTML file with charts "
                   "(- : the HTML alone, on stdout)")
    p.add_argument("--since", type=iso_time, default=None,
                   help="window start (ISO 8601; UTC when no offset is given): every "
                   "section but borrowing covers only [since, until)")
    p.add_argument("--until", type=iso_time, default=None,
                   help="window end (ISO 8601, exclusive)")
    p.add_argument("--whatif", action="store_true",
                   help="add the what-if section: the history replayed under the built-in "
                   "policies beside what was observed (docs/whatif.md; replays, seconds "
                   "per simulated day)")
    p.add_argument("--top", type=positive(int, "--top"), default=10,
                   help="rows shown in long tables (default 10); in HTML the next ones "
                   "are folded under the table")
    p.add_argument("--width", type=terminal_width("--width"), default=None,
                   help="terminal width for the tables, at least "
                   f"{TERMINAL_COLUMNS_MIN} (default: the terminal's)")
    p.add_argument("--quiet", action="store_true",
                   help="with --html: do not print the tables")
    p.add_argument("--timeout", type=time_limit("--timeout"), default=300.0,
                   metavar="SECONDS", help="stop a section's query after this long "
                   "(default 300; 'inf': no limit)")
    p.set_defaults(func=cmd_report)
