"""``gpuledger whatif`` and ``gpuledger diagnose``: registered through ``COMMAND_MODULES``
(imports nothing heavy at module level)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuledger.cli.arguments import TERMINAL_COLUMNS_MIN, iso_time, positive, terminal_width
from gpuledger.cli.errors import CliError, need_pipeline

TOP_MAX = 1_000_000
"""``diagnose --top`` at most (a summary line per attempt)."""
EVERY_MAX = 31 * 86_400
"""``diagnose --every`` at most, in seconds (a month)."""
STEP_MAX = 10_000_000
"""``whatif --step`` at most, in minutes (a step is also refused beyond the window)."""


def _say(quiet: bool, command: str) -> Callable[[str], None]:
    def say(message: str) -> None:
        if not quiet:
            print(f"{command}: {message} …", file=sys.stderr, flush=True)
    return say


def cmd_whatif(args: argparse.Namespace) -> int:
    need_pipeline()
    from rich.console import Console

    from gpuledger.pipeline.advisor.history import HistoryError
    from gpuledger.pipeline.advisor.output import print_whatif, to_json
    from gpuledger.pipeline.advisor.policy import PolicyError, load_policies
    from gpuledger.pipeline.advisor.whatif import run_whatif

    if args.since and args.until and args.since >= args.until:
        raise CliError("--since must be before --until")
    try:
        policies = load_policies(args.policies)
        result = run_whatif(args.warehouse, policies, args.policy or None, args.since,
                            args.until, args.step, _say(args.quiet, "whatif"))
    except (PolicyError, HistoryError, ValueError) as exc:
        raise CliError(str(exc)) from None
    if args.json:
        sys.stdout.write(to_json(result))
    else:
        print_whatif(result, Console(width=args.width))
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    need_pipeline()
    if args.every is not None:
        if args.json:
            raise CliError("--json prints one run's rows; with --every each run prints a "
                           "line (query job_diagnosis for the rows)")
        return _diagnose_every(args)
    from gpuledger.cli.main import _progress
    from gpuledger.pipeline.advisor.diagnosis_batch import (
        diagnose_warehouse,
        open_warehouse,
        summary_text,
        warn_once,
    )
    from gpuledger.pipeline.advisor.history import HistoryError

    # a bar on stderr, as the imports draw (a line per hour of history: 1,209 lines
    # for the openb trace), once the warehouse is known to be one
    try:
        with warn_once():   # a manifest passed over is said once, not by each reader
            opened = open_warehouse(args.warehouse)
            with _progress("diagnosing", not args.quiet) as update:
                result = diagnose_warehouse(opened, write=not args.dry_run,
                                            progress=update, force=args.force)
    except HistoryError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        sys.stdout.write(result.rows.write_ndjson())
    else:
        print(summary_text(result, args.top))
    return 0


def _diagnose_every(args: argparse.Namespace) -> int:
    """``--every SECONDS``: diagnose now and then every SECONDS, a line per run, until
    SIGTERM/SIGINT (exit status 0). A run that cannot diagnose (nothing published yet, a
    bucket out of reach, a writer at work on an earlier version's files) says why in a
    warning and the next run tries again: beside a processor that has not published yet,
    the command waits for it rather than stop."""
    from gpuledger.cli.bridge_command import stop_on_signals
    from gpuledger.pipeline.advisor.diagnosis_batch import diagnose_warehouse
    from gpuledger.pipeline.advisor.history import HistoryError

    stop = stop_on_signals()
    while not stop.is_set():
        started = time.monotonic()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:
            result = diagnose_warehouse(args.warehouse, write=not args.dry_run,
                                        force=args.force)
        except HistoryError as exc:
            print(f"gpuledger: warning: diagnose at {stamp}: {exc}; again in "
                  f"{args.every:g} s", file=sys.stderr, flush=True)
        else:
            rows = result.rows
            print(f"diagnose at {stamp}: {rows.height:,} row(s), "
                  f"{float(rows['gpu_hours'].sum()):,.1f} idle or inefficient GPU-hours, "
                  f"{result.files} file(s) written in {time.monotonic() - started:.1f} s",
                  flush=True)
        stop.wait(args.every)
    return 0


def register(subparsers: Any, common: Callable[..., None]) -> None:
    p = subparsers.add_parser(
        "whatif", help="replay the warehouse's history under other scheduling policies",
        description="Replay a window of the warehouse's history (every attempt with its "
        "request, queue, team, priority, times and preemptibility; the nodes; the outages) "
        "through the scheduler model under named policies — placement (best-fit, worst-fit, "
        "fgd, topology), card pools by job type, quota fixed or with borrowing, back-fill, "
        "preemption and reclaim — and print each answer (queue wait p50/p90/p99 by queue "
        "and size, blocked demand, frag(k), allocated and used GPU-hours, preemption lost "
        "work, per team) beside what was observed, with the calibration error of the "
        "baseline replay beside every answer (docs/whatif.md). Without --policies, a "
        "built-in set of policies runs.")
    p.add_argument("--warehouse", default=None, metavar="PATH|s3://BUCKET/PREFIX",
                   help="warehouse: a folder or s3://bucket/prefix, read-only "
                   "(docs/warehouse.md); default: GPULEDGER_WAREHOUSE__URL, else ./warehouse")
    p.add_argument("--policies", type=Path, default=None, metavar="FILE",
                   help="policy file (YAML, docs/whatif.md); default: the built-in set")
    p.add_argument("--policy", action="append", default=None, metavar="NAME",
                   help="replay only this policy (repeatable; the baseline always runs)")
    p.add_argument("--since", type=iso_time, default=None,
                   help="window start (ISO 8601, a whole minute; default: the first "
                   "GPU-minute)")
    p.add_argument("--until", type=iso_time, default=None,
                   help="window end (ISO 8601, a whole minute, exclusive; default: after "
                   "the last one)")
    p.add_argument("--step", type=positive(int, "--step", at_most=STEP_MAX), default=None,
                   metavar="MINUTES",
                   help="sample the replays' frag(k) and blocked demand every MINUTES from "
                   "the window start, at most the window (default: 1, more for long "
                   "windows); the observed column and every other answer do not depend on it")
    p.add_argument("--json", action="store_true", help="print one JSON document instead")
    p.add_argument("--width", type=terminal_width("--width"), default=None,
                   help="terminal width for the tables, at least "
                   f"{TERMINAL_COLUMNS_MIN} (default: the terminal's)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_whatif)

    d = subparsers.add_parser(
        "diagnose", help="say why allocated GPUs sat idle or inefficient, per job attempt",
        description="Classify every idle or inefficient GPU-minute of each job attempt in "
        "the warehouse into a documented pattern (input-bound, communication-bound, "
        "memory-bound, checkpoint stall, under-filled inference, held with no process, "
        "unknown) with its evidence and remedy, and write the job_diagnosis fact "
        "(docs/diagnosis.md). Re-running rewrites the same files.")
    d.add_argument("--warehouse", default=None, metavar="PATH|s3://BUCKET/PREFIX",
                   help="warehouse: a folder or s3://bucket/prefix (docs/warehouse.md); "
                   "default: GPULEDGER_WAREHOUSE__URL, else ./warehouse; job_diagnosis is "
                   "written into it, beside the facts")
    d.add_argument("--dry-run", action="store_true",
                   help="compute and print, but do not write job_diagnosis")
    d.add_argument("--json", action="store_true",
                   help="print the job_diagnosis rows as JSON lines instead of a summary")
    d.add_argument("--top", type=positive(int, "--top", at_most=TOP_MAX), default=10,
                   help=f"attempts shown in the summary (default 10, at most {TOP_MAX:,})")
    d.add_argument("--force", action="store_true",
                   help="take job_diagnosis files an earlier version wrote into the "
                   "warehouse's own unit out of it although that unit was published in the "
                   "last minute (docs/diagnosis.md)")
    d.add_argument("--every", type=positive(float, "--every", at_most=EVERY_MAX),
                   default=None, metavar="SECONDS",
                   help="keep running: diagnose now and then every SECONDS, a line per run, "
                   "until SIGTERM/SIGINT (beside a Kafka service, whose processors do not "
                   "diagnose; a run that cannot diagnose yet warns, and the next one tries "
                   "again)")
    d.add_argument("--quiet", action="store_true", help="no progress on stderr")
    d.set_defaults(func=cmd_diagnose)
