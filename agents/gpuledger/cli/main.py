"""The ``gpuledger`` command.

The command itself is part of the lean base install; subcommands that need the
pipeline (Polars, DuckDB) import it only when they run, and say how to install it when
it is missing.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpuledger.cli import whole_writes
from gpuledger.cli.arguments import (
    INT32_MAX,
    READ_WAREHOUSE_HELP,
    SIMULATED_HOURS_MAX,
    WAREHOUSE_HELP,
    add_replace,
    file_name_part,
    non_negative,
    positive,
    time_limit,
    warehouse_location,
    whole_count,
)
from gpuledger.cli.errors import CliError, check_input_files, need_pipeline
from gpuledger.cli.kafka_errors import topics_created, unreachable_said
from gpuledger.cli.log_setup import configure as configure_logging
from gpuledger.http_url import redacted

DEFAULT_WAREHOUSE = Path("warehouse")


_need_pipeline = need_pipeline


@contextmanager
def _progress(label: str, enabled: bool) -> Iterator[Callable[[float], None]]:
    """A progress bar on stderr (rich), for the work done inside the ``with``; it gives
    the function that moves it (a fraction done). When the work ends, the bar shows it
    whole; when the work fails, it stays where the work stopped (it showed 100 % over the
    error)."""
    if not enabled:
        yield lambda _f: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    # stderr, never stdout: the summary (and `> file`) stays clean
    bar = Progress(TextColumn("{task.description}"), BarColumn(),
                   TextColumn("{task.percentage:>5.1f}%"), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=False)
    task = bar.add_task(label, total=1.0)
    bar.start()
    try:
        yield lambda fraction: bar.update(task, completed=fraction)
        bar.update(task, completed=1.0)
    finally:
        bar.stop()


def _start_time(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--start must be an ISO 8601 time such as 2026-01-05T00:00Z, got {text!r}"
        ) from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _sim_config(args: argparse.Namespace, future_s: float | None = None) -> Any:
    """The simulation the options ask for. Its events must be ones the processor takes:
    from 2000 on (``validate.MIN_TIME``), the cluster's warm-up included, to the end of
    year 9999; processed now (``future_s``: the demo's ``windows.max_future_s``, or the
    default one for ``simulate``, whose files an ingest reads), not ending more than that
    after the wall clock, or every later sample is rejected as from the future."""
    from gpuledger.pipeline.simulate import SimConfig, load_cluster
    from gpuledger.pipeline.validate import MIN_TIME

    kw: dict[str, Any] = {"hours": args.hours, "seed": args.seed,
                          "sample_interval_s": args.interval}
    if args.start is not None:
        kw["start"] = args.start
    if args.cluster is not None:
        try:
            kw["cluster"] = load_cluster(args.cluster)
        except ValueError as exc:  # ClusterSpecError: the file and the reason
            raise CliError(f"--cluster: {exc}") from None
    sim = SimConfig(**kw)
    warmup = timedelta(hours=(sim.cluster or load_cluster(None)).warmup_hours)
    start = sim.start if sim.start.tzinfo else sim.start.replace(tzinfo=UTC)
    if start < MIN_TIME + warmup:  # (start - warmup underflows before year 1)
        raise CliError(f"--start {start.year:04d}{start:-%m-%dT%H:%MZ}: the simulation "
                       f"(with its {warmup.total_seconds() / 3600:g} h warm-up) would begin before "
                       f"{MIN_TIME:%Y-%m-%d}, and events before then are rejected; start "
                       f"at {MIN_TIME + warmup:%Y-%m-%dT%H:%MZ} or later")
    last = datetime(9999, 12, 31, 23, 59, tzinfo=UTC)
    if start > last - timedelta(hours=sim.hours):
        raise CliError(f"--start {start:%Y-%m-%dT%H:%MZ} with --hours {sim.hours:g}: the "
                       "simulation would go past the year 9999")
    if future_s is not None:
        end = start + timedelta(hours=sim.hours)
        ahead = timedelta(seconds=future_s)
        if end > datetime.now(UTC) + ahead:
            raise CliError(f"--start {start:%Y-%m-%dT%H:%MZ} with --hours {sim.hours:g} ends "
                           f"at {end:%Y-%m-%dT%H:%MZ}, more than "
                           f"{ahead.total_seconds():g} s after now: the processor rejects "
                           "events from the future (windows.max_future_s); start earlier")
    return sim


def _proc_config(args: argparse.Namespace) -> Any:
    from gpuledger.pipeline.config import ConfigError, load_config

    try:
        return load_config(args.config)
    except ConfigError as exc:
        raise CliError(f"configuration: {exc}") from None


def _kafka_settings(args: argparse.Namespace) -> Any:
    from gpuledger.pipeline.kafka.settings import KafkaSettingsError, load_settings

    environ = None
    if getattr(args, "topic_prefix", None):
        import os

        environ = {**os.environ, "GPULEDGER_KAFKA_TOPIC_PREFIX": args.topic_prefix}
    try:
        return load_settings(args.kafka, environ)
    except KafkaSettingsError as exc:
        raise CliError(f"kafka: {exc}") from None


def _logging(verbose: bool) -> None:
    configure_logging(logging.INFO if verbose else logging.WARNING)


def cmd_demo(args: argparse.Namespace) -> int:
    _need_pipeline()
    config = _proc_config(args)
    sim = _sim_config(args, future_s=config.windows.max_future_s)
    if args.topic_prefix and not args.kafka:
        raise CliError("--topic-prefix names the Kafka topics: it needs --kafka")
    if (args.metrics_address or args.alert_webhook) and args.kafka:
        raise CliError("--metrics-address and --alert-webhook work with the embedded bus; "
                       "with Kafka, run: gpuledger process --metrics-address HOST:PORT")
    _check_ops_options(args)  # before an earlier demo is cleared
    from gpuledger.pipeline.demo import check_for_demo, clear_demo

    earlier = check_for_demo(args.warehouse)
    if earlier is not None:
        cleared = clear_demo(earlier)
        if cleared and not args.quiet:
            print(f"replacing the earlier demo's warehouse in {args.warehouse} "
                  f"({cleared:,} file(s) deleted)", file=sys.stderr)
    ops = _ops(args, config)
    try:
        return _demo_run(args, sim, config, ops)
    except BaseException:
        if ops is not None:  # Ctrl-C, an error: queued alerts are counted, not waited for
            ops.close(timeout_s=0)
        raise


def _demo_run(args: argparse.Namespace, sim: Any, config: Any, ops: Any) -> int:
    from gpuledger.pipeline.report import summary_text

    started = time.monotonic()
    with _progress(f"simulating {sim.hours:g} h and processing", not args.quiet) as update:
        if args.kafka:
            from gpuledger.pipeline.kafka.demo import run_kafka_demo

            settings = _kafka_settings(args)
            with unreachable_said(settings.bootstrap):
                result = run_kafka_demo(sim, config, args.warehouse, settings, update)
        else:
            from gpuledger.pipeline.demo import run_demo

            result = run_demo(sim, config, args.warehouse, update,
                              on_processor=ops.follow if ops is not None else None)
        # the why of idle/inefficient GPU-time (docs/diagnosis.md), in a folder or a bucket
        from gpuledger.pipeline.advisor.diagnosis_batch import diagnose_warehouse
        from gpuledger.pipeline.advisor.history import HistoryError

        try:
            diagnose_warehouse(args.warehouse)
        except HistoryError as exc:  # nothing to diagnose (every sample rejected)
            print(f"gpuledger: warning: diagnose: {exc}", file=sys.stderr)
    elapsed = time.monotonic() - started
    c = result.counters
    print(f"processed {c.records_in['telemetry']:,} GPU samples, "
          f"{c.records_in['job']:,} job events, {c.records_in['inventory']:,} inventory records "
          f"in {elapsed:.1f} s → {args.warehouse}/ "
          f"({sum(c.fact_rows.values()):,} fact rows)")
    print(summary_text(args.warehouse))
    print(f"Query it: gpuledger query --warehouse {args.warehouse} "
          "\"SELECT * FROM utilisation_by_team\"")
    if ops is not None:
        _ops_finish(ops)
    return 0


def _check_ops_options(args: argparse.Namespace) -> None:
    """A :class:`CliError` for a ``--alert-webhook`` or ``--metrics-address`` that is
    not one, said before anything else is done (a broker waited for, a topic made, an
    earlier demo cleared): each command that takes them calls it first."""
    from gpuledger.pipeline.alerts.sinks import webhook_problem
    from gpuledger.pipeline.exporter.server import AddressError, parse_address

    problem = webhook_problem(args.alert_webhook) if args.alert_webhook is not None else None
    if problem:
        raise CliError(f"--alert-webhook: {redacted(args.alert_webhook)!r}: {problem}")
    if args.metrics_address:
        try:
            parse_address(args.metrics_address)
        except AddressError as exc:
            raise CliError(f"--metrics-address: {exc}") from None


def _ops(args: argparse.Namespace, config: Any, kafka: Any = None) -> Any:
    """The exporter and alert engine the options ask for (gpuledger.pipeline.ops), or None."""
    if not (args.metrics_address or args.alert_webhook or kafka is not None):
        return None
    from gpuledger.pipeline.exporter.server import AddressError
    from gpuledger.pipeline.ops import OpsSurface

    try:
        # the alerts topic is made at the start: Kafka must answer
        if kafka is not None:
            logging.getLogger("gpuledger.cli").info(
                "connecting to Kafka at %s (to make the alerts topic)", kafka.bootstrap)
        with unreachable_said(kafka.bootstrap if kafka is not None else None):
            ops = OpsSurface(config, args.metrics_address, args.alert_webhook, kafka)
        url = ops.start()
    except (AddressError, OSError) as exc:
        raise CliError(f"--metrics-address: {exc}") from None
    if url:
        print(f"serving {url}", file=sys.stderr, flush=True)
    return ops


def _ops_finish(ops: Any) -> None:
    """Print the alerts summary; keep serving /metrics until SIGTERM/SIGINT."""
    import signal
    import threading

    ops.deliver()  # the webhook's queued alerts, for at most 10 s; the rest is counted
    summary = ops.summary()
    if summary:
        print(summary)
    if ops.port is not None:
        done = threading.Event()
        before = {sig: signal.signal(sig, lambda _s, _f: done.set())
                  for sig in (signal.SIGTERM, signal.SIGINT)}
        print("serving the final minute's metrics until interrupted (Ctrl-C)",
              file=sys.stderr, flush=True)
        done.wait()
        for sig, handler in before.items():  # a second Ctrl-C interrupts the stop
            signal.signal(sig, handler)
    ops.close()


def cmd_simulate(args: argparse.Namespace) -> int:
    _need_pipeline()
    from gpuledger.pipeline.config import Windows
    from gpuledger.pipeline.simulate import simulate, write_jsonl

    # (its events are for an ingest, now: those past its lead are all rejected)
    sim = _sim_config(args, future_s=Windows().max_future_s)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"--out {args.out}: {exc.strerror or exc}"
                       + (" (a file is there: --out names a folder)"
                          if args.out.exists() and not args.out.is_dir() else "")) from None
    total = sim.hours * 60
    done = [0.0]

    def batches(update: Callable[[float], None]) -> Any:
        for batch in simulate(sim):
            yield batch
            done[0] += sim.chunk_minutes
            update(min(done[0] / total, 1.0))

    with _progress(f"simulating {sim.hours:g} h", not args.quiet) as update:
        counts = write_jsonl(batches(update), args.out)
    for kind, n in counts.items():
        print(f"{args.out / (kind + '.jsonl')}: {n:,} lines")
    return 0


def cmd_ingest(args: argparse.Namespace) -> int:
    _need_pipeline()
    from gpuledger.pipeline.demo import check_not_demo
    from gpuledger.pipeline.ingest import ingest

    check_input_files(*args.files)
    check_not_demo(args.warehouse)
    config = _proc_config(args)
    with _progress("ingesting", not args.quiet) as update:
        result = ingest(args.files, args.warehouse, config, update, afresh=args.afresh)
    rej = result.rejects
    if result.held and result.held_before is not None:
        print(f"{result.held:,} inventory record(s) dated before "
              f"{result.held_before:%Y-%m-%d %H:%M} UTC are node states the history in "
              f"{args.warehouse}/ already holds: left out (they change nothing)",
              file=sys.stderr)
    if result.nothing and result.held:
        print(f"nothing to ingest: the history already holds every record of the input "
              f"({rej.height:,} bad line(s)); {args.warehouse}/ is left as it was",
              file=sys.stderr)
    elif result.nothing:
        print(f"nothing to ingest: no valid record in the input ({rej.height:,} bad "
              f"line(s)); {args.warehouse}/ is left as it was", file=sys.stderr)
    elif result.continued_from is not None:
        print(f"continuing from the state an earlier ingest into {args.warehouse}/ saved "
              f"when it had closed up to {result.continued_from:%Y-%m-%d %H:%M} UTC (its "
              "running jobs go on)", file=sys.stderr)
    if result.replaced_from is not None:
        print(f"processed on its own{' (--afresh)' if args.afresh else ''}: the facts "
              f"{args.warehouse}/ held from {result.replaced_from:%Y-%m-%d %H:%M} UTC to the "
              "input's end are replaced by this input's alone (the history's first piece "
              "again, or the whole history)", file=sys.stderr)
    if not result.nothing:
        print(f"ingested {result.records['telemetry']:,} telemetry, "
              f"{result.records['job']:,} job and {result.records['inventory']:,} inventory "
              f"records into {args.warehouse}/; {rej.height:,} bad line(s)")
    closed = result.closed_to
    if closed is not None:
        print(f"closed up to {closed:%Y-%m-%d %H:%M} UTC: the next piece goes on from there"
              + (f", or from {result.open_from:%H:%M} if it starts inside the last minute"
                 if result.open_from is not None else "")
              + ("" if closed.minute == 0 else
                 f" (the hour from {closed:%H}:00 is not whole yet: the next piece "
                 "rewrites it whole)"), file=sys.stderr)
    early = [f"{n:,} {kind} {'event' if kind == 'job' else 'record'}{'' if n == 1 else 's'}"
             for kind in ("job", "inventory") if (n := result.early.get(kind, 0))]
    if early and result.facts_begin is not None:
        print(f"early: {' and '.join(early)} dated before {result.facts_begin:%Y-%m-%d %H:%M} "
              "UTC, where the facts begin (far before the bulk of the input): they only "
              "updated the books", file=sys.stderr)
    c = result.counters
    if c.late_telemetry or c.late_job_events:
        print(f"late: {c.late_telemetry:,} telemetry samples (kept in late_telemetry), "
              f"{c.late_job_events:,} job events"
              + (f" ({c.late_overcharged_ms / 3_600_000:,.2f} GPU-hours charged after "
                 f"attempts ended, {c.late_undercharged_ms / 3_600_000:,.2f} not charged "
                 "before they started)"
                 if c.late_overcharged_ms or c.late_undercharged_ms else ""),
              file=sys.stderr)
    shown = rej.head(args.show_rejects)
    for source, line, reason in shown.select("source", "line", "reason").iter_rows():
        print(f"{source}:{line}: {reason}" if line is not None else f"{source}: {reason}",
              file=sys.stderr)
    if rej.height > shown.height:
        where = "--show-rejects N to see them" if result.nothing else "SELECT * FROM rejects"
        print(f"... and {rej.height - shown.height:,} more ({where})", file=sys.stderr)
    # the processor's rejects (samples of GPUs no inventory knows, …) count too
    return 1 if (args.strict and (rej.height or sum(c.rejected.values()))) else 0


def cmd_import_openb(args: argparse.Namespace) -> int:
    _need_pipeline()
    from gpuledger.pipeline.demo import check_not_demo
    from gpuledger.pipeline.importers.openb import OpenbImportError, load_openb
    from gpuledger.pipeline.ingest import has_jobs, import_history
    from gpuledger.pipeline.processor import Processor
    from gpuledger.pipeline.warehouse import Warehouse

    check_input_files(args.nodes, args.pods)
    check_not_demo(args.warehouse)
    lo = args.from_hours * 3600.0
    hi = lo + args.hours * 3600.0 if args.hours is not None else None
    # pods alive at a window's start keep their own submission and start times; the
    # processor begins at the window's start (minutes before it are not the window's)
    kw: dict[str, Any] = {"window_from_s": lo, "window_to_s": hi, "real_times": lo > 0}
    if args.start is not None:
        kw["start"] = args.start
    try:
        imported = load_openb(args.nodes, args.pods, **kw)
    except OpenbImportError as exc:
        raise CliError(str(exc)) from None
    config = _proc_config(args)
    if not has_jobs(imported.frames) and imported.window_end is None:
        # no pod and no window (`import pods` alike): the warehouse is not opened
        print(f"nothing to import: {args.pods} has no GPU pod ({imported.pods_total:,} "
              f"pods, {imported.pods_cpu_only:,} CPU-only); {args.warehouse}/ is left as it "
              "was", file=sys.stderr)
        return 0
    processor = Processor(config, Warehouse(args.warehouse, options=config.warehouse))
    if imported.window_start is not None:
        processor.begin_at(imported.window_start)
    with _progress("importing openb", not args.quiet) as update:
        rejected = import_history(processor, imported.frames, update, imported.window_end,
                                  replace=args.replace)
    print(f"openb: {imported.pods_total:,} pods ({imported.pods_cpu_only:,} CPU-only skipped), "
          f"{imported.pods_imported:,} imported into {args.warehouse}/; "
          f"{len(imported.unplaced):,} could not be placed"
          + (f" (e.g. {', '.join(imported.unplaced[:5])})" if imported.unplaced else "")
          + (f"; {rejected:,} event(s) rejected (SELECT * FROM rejects)" if rejected else ""))
    return 0


def cmd_topics(args: argparse.Namespace) -> int:
    _need_pipeline()
    settings = _kafka_settings(args)
    result = topics_created(settings, args.telemetry_partitions, args.replication)
    for topic, what in result.items():
        print(f"{topic}: {what}")
    unfit = result.unfit
    if unfit:
        sys.stdout.flush()
        raise CliError(f"{len(unfit)} existing topic(s) unfit for gpuledger: "
                       f"{', '.join(unfit)} (each line above says why and how to fix it; "
                       "a broker that creates topics on first use made them before "
                       "`topics create` ran?)")
    return 0


SERVICE_TIMEOUTS = (
    ("--session-timeout-ms", "GPULEDGER_KAFKA_SESSION_TIMEOUT_MS", 10_000,
     "the group drops an instance it has not heard from for this long; its partitions "
     "move to the others"),
    ("--heartbeat-interval-ms", "GPULEDGER_KAFKA_HEARTBEAT_INTERVAL_MS", 3_000,
     "how often the instance tells the group it is alive (at most a third of the session "
     "timeout)"),
    ("--max-poll-interval-ms", "GPULEDGER_KAFKA_MAX_POLL_INTERVAL_MS", 300_000,
     "the group drops an instance that does not poll for this long"),
    ("--request-timeout-ms", "GPULEDGER_KAFKA_REQUEST_TIMEOUT_MS", 305_000,
     "how long a request to the broker may take (kafka-python)"),
)
"""The Kafka service's group and client timeouts: flag, environment variable, default."""
MAX_POLL_SAMPLES = 1_000_000
"""``ServiceOptions.max_poll_samples`` (the pipeline may not be installed to read it)."""


def cmd_process(args: argparse.Namespace) -> int:
    _need_pipeline()
    from gpuledger.pipeline.checkpoint import CheckpointError
    from gpuledger.pipeline.demo import check_not_demo
    from gpuledger.pipeline.kafka.service import (
        KafkaProcessorService,
        ServiceOptions,
        ServiceStartError,
        check_input_topics,
    )

    _logging(not args.quiet)
    check_not_demo(args.warehouse)
    settings = _kafka_settings(args)
    options = ServiceOptions(group_id=args.group, checkpoint_interval_s=args.checkpoint_interval,
                             exit_when_idle_s=args.exit_when_idle,
                             max_poll_samples=args.max_poll_samples,
                             instance_id=args.instance_id,
                             session_timeout_ms=args.session_timeout_ms,
                             heartbeat_interval_ms=args.heartbeat_interval_ms,
                             max_poll_interval_ms=args.max_poll_interval_ms,
                             request_timeout_ms=args.request_timeout_ms)
    if options.heartbeat_interval_ms * 3 > options.session_timeout_ms:
        raise CliError(f"--heartbeat-interval-ms ({options.heartbeat_interval_ms}) must be at "
                       f"most a third of --session-timeout-ms ({options.session_timeout_ms})")
    config = _proc_config(args)
    _check_ops_options(args)  # said before the broker is waited for
    if not args.no_alerts:   # the alerts topic is made next: not under a prefix of no input
        try:
            check_input_topics(settings)
        except ServiceStartError as exc:
            raise CliError(str(exc)) from None
    # the ops surface first: a bad --metrics-address is said before the broker is waited for
    ops = _ops(args, config, None if args.no_alerts else settings)
    try:
        try:
            service = KafkaProcessorService(settings, config, args.warehouse, options)
        except BaseException:
            if ops is not None:
                ops.close()
            raise
        if ops is not None:
            ops.follow_service(service)
        service.install_signal_handlers()
        try:
            service.run()
            if service.unfinished:   # said in the log: not "all input processed"
                return 1
        finally:
            service.close()
            if ops is not None:
                ops.close()
    except ServiceStartError as exc:
        raise CliError(str(exc)) from None
    except CheckpointError as exc:  # read at the start, or when a rebalance assigns
        raise CliError(f"{exc}; the service stops rather than rebuild that state from "
                       "nothing: restore the file, or move it aside to rebuild the state "
                       "from the records the topics still retain") from None
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    _need_pipeline()
    from gpuledger.pipeline import query

    try:
        sql = args.sql if args.sql != "-" else sys.stdin.buffer.read().decode("utf-8")
        sql.encode("utf-8")  # an argument's undecodable bytes come as lone surrogates
    except UnicodeError:
        raise CliError("the query is not UTF-8 text") from None
    started = time.monotonic()   # the time limit covers the query and its output
    deadline = None if math.isinf(args.timeout) else started + args.timeout
    try:
        with query.run_stream(args.warehouse, sql, args.timeout, deadline) as result:
            if args.format == "table":   # sized from every row: collected first
                rows = query.table_rows(result)
                sys.stdout.write(query.render(result.columns, rows, "table", deadline,
                                              args.timeout))
            else:                        # written a chunk at a time, as the rows come
                for text in query.render_chunks(result.columns, result, args.format):
                    sys.stdout.write(text)
            sys.stdout.flush()           # a closed pipe shows here, with the query stopped
    except query.QueryError as exc:
        raise CliError(str(exc)) from None
    return 0    # a closed pipe (| head) leaves the with block, stopping the query: main()


def _stdout_gone() -> None:
    """The reader of stdout has gone (``| head``): point stdout at /dev/null, so that the
    interpreter's last flush does not fail with a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


# Commands kept in modules of their own. Each module has
# ``register(subparsers, common)``, where ``common(parser)`` adds the warehouse options;
# a module imports its heavy dependencies inside its command function, so that
# ``gpuledger --help`` and the agent work on the lean base install.
COMMAND_MODULES: tuple[str, ...] = ("gpuledger.pipeline.analyst_report.command",
                                    "gpuledger.pipeline.compact_command",
                                    "gpuledger.pipeline.dashboards.command",
                                    "gpuledger.pipeline.livefeed.command",
                                    "gpuledger.cli.bridge_command",
                                    "gpuledger.cli.agent_command",
                                    "gpuledger.pipeline.alerts.command",
                                    "gpuledger.pipeline.advisor.command")
# Formats of ``gpuledger import`` kept in modules of their own (same ``register``).
IMPORT_MODULES: tuple[str, ...] = ("gpuledger.cli.import_pods",
                                   "gpuledger.cli.import_slurm_sacct")


def _ops_args(p: argparse.ArgumentParser) -> None:
    """Options of the ops surface (exporter, alert engine) of demo and process."""
    p.add_argument("--metrics-address", metavar="HOST:PORT", default=None,
                   help="serve Prometheus /metrics of the latest closed minute here "
                   "(docs/prometheus.md); the demo keeps serving until interrupted")
    p.add_argument("--alert-webhook", metavar="URL", default=None,
                   help="POST alerts in Alertmanager's shape to URL, e.g. "
                   "http://alertmanager:9093/api/v2/alerts (docs/alerts.md)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuledger",
        description="Where your GPUs go: telemetry + scheduler events → facts on "
        "allocation vs use, idle vs inefficient, fragmentation, queue wait and preemption.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def sim_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--hours", type=positive(float, "--hours", at_most=SIMULATED_HOURS_MAX),
                       default=24.0, help="simulated span in hours (default 24, at most "
                       f"{SIMULATED_HOURS_MAX:,}: 366 days)")
        p.add_argument("--seed", type=whole_count("--seed"), default=7,
                       help="random seed (default 7)")
        p.add_argument("--interval", type=positive(int, "--interval"), default=10,
                       help="telemetry sample interval in seconds (default 10)")
        p.add_argument("--start", type=_start_time, default=None,
                       help="simulated start time, ISO 8601 UTC (default 2026-01-05T00:00Z); "
                       "the simulation may end at most windows.max_future_s after now "
                       "(later events are rejected as from the future)")
        p.add_argument("--cluster", type=Path, default=None,
                       help="cluster spec YAML (default: the built-in 576-GPU cluster)")

    def common(p: argparse.ArgumentParser, warehouse: bool = True) -> None:
        """Options of every command that writes a warehouse (or, without it, of simulate)."""
        if warehouse:
            p.add_argument("--config", type=Path, default=None,
                           help="processor configuration YAML (docs/configuration.md)")
            p.add_argument("--warehouse", default=None, metavar="PATH|s3://BUCKET/PREFIX",
                           help=WAREHOUSE_HELP)
        p.add_argument("--quiet", action="store_true", help="no progress bar")

    p = sub.add_parser("demo", help="simulate a cluster day and build a warehouse from it",
                       description="Simulate a cluster (default: 24 h of the built-in "
                       "cluster), stream it through the processor on the embedded bus into "
                       "a Parquet/DuckDB warehouse, and print the summary tables. The "
                       "warehouse must be empty or a demo's: one holding other facts "
                       "(ingested, imported) is refused, so simulated jobs never mix with "
                       "real ones.")
    sim_args(p)
    common(p)
    p.add_argument("--kafka", metavar="BOOTSTRAP", default=None,
                   help="run the demo through this Kafka cluster instead of the embedded bus "
                   "(topics are created; credentials from GPULEDGER_KAFKA_* variables)")
    p.add_argument("--topic-prefix", default=None, help="prefix for the topic names")
    _ops_args(p)
    p.set_defaults(func=cmd_demo)

    def kafka_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--kafka", metavar="BOOTSTRAP", default=None,
                       help="HOST:PORT[,HOST:PORT] (default $GPULEDGER_KAFKA_BOOTSTRAP); "
                       "security from GPULEDGER_KAFKA_* variables, see docs/kafka.md")
        p.add_argument("--topic-prefix", default=None, help="prefix for the topic names")

    p = sub.add_parser("topics", help="Kafka topics: create them",
                       description="Create gpuledger's six topics (gpu.telemetry.v1, "
                       "gpu.inventory.v1, sched.events.v1, gpuledger.deadletter.v1, "
                       "gpuledger.attempt-parts.v1, gpuledger.alerts.v1; with --topic-prefix "
                       "before each) with their partitions, retention and compaction "
                       "(docs/kafka.md, Topics). Existing topics are left as they are, "
                       "compared with these: another partition count is said; another "
                       "cleanup policy or a shorter retention is unfit, said with the fix, "
                       "exit status 2.")
    p.add_argument("action", choices=("create",), help="what to do")
    kafka_args(p)
    p.add_argument("--telemetry-partitions", type=positive(int, "--telemetry-partitions"),
                   default=12, help="partitions of the telemetry topic (default 12)")
    p.add_argument("--replication", type=positive(int, "--replication"), default=1,
                   help="replication factor (default 1)")
    p.set_defaults(func=cmd_topics)

    p = sub.add_parser("process", help="run the processor as a Kafka service",
                       description="Consume telemetry (consumer group), scheduler events and "
                       "inventory from Kafka and write facts to the warehouse, checkpointing "
                       "state and offsets together; SIGTERM finishes the batch, writes, "
                       "checkpoints and commits.")
    kafka_args(p)
    common(p)
    p.add_argument("--group", type=file_name_part(
                       "--group", "the group's checkpoint folder, <state>/<group>/"),
                   default="gpuledger-processor",
                   help="consumer group id: one per deployment (warehouse); a group "
                   "another warehouse's service is live in is refused (docs/kafka.md)")
    p.add_argument("--instance-id", type=file_name_part(
                       "--instance-id", "its checkpoint, global-<instance>.checkpoint"),
                   default=None,
                   help="static group membership id (a restarted instance keeps its "
                   "partitions without waiting for a rebalance)")
    p.add_argument("--checkpoint-interval", type=positive(float, "--checkpoint-interval"),
                   default=10.0, help="seconds between checkpoints (default 10)")
    p.add_argument("--exit-when-idle", type=positive(float, "--exit-when-idle"), default=None,
                   metavar="SECONDS", help="flush everything and exit after this long without "
                   "input (for batch runs); an instance that does not hold every partition "
                   "also waits until its assignment has stood for the session timeout and "
                   "two heartbeats (16 s by default), so that a killed member's partitions "
                   "come back first; exit status 1 when partitions of a member that died are "
                   "still unprocessed then; default: run until SIGTERM")
    p.add_argument("--max-poll-samples", type=positive(int, "--max-poll-samples"),
                   metavar="N", default=os.environ.get("GPULEDGER_KAFKA_MAX_POLL_SAMPLES",
                                                       str(MAX_POLL_SAMPLES)),
                   help="a telemetry poll takes about this many samples at most, however "
                   "long the backlog: it bounds the memory of a catch-up (default "
                   f"{MAX_POLL_SAMPLES:,}; environment "
                   "GPULEDGER_KAFKA_MAX_POLL_SAMPLES)")
    for flag, env, default, what in SERVICE_TIMEOUTS:
        p.add_argument(flag, type=positive(int, flag, at_most=INT32_MAX), metavar="MS",
                       default=os.environ.get(env, str(default)),
                       help=f"{what} (default {default}; environment {env})")
    _ops_args(p)
    p.add_argument("--no-alerts", action="store_true",
                   help="do not run the alert engine (default: alerts go to the "
                   "gpuledger.alerts.v1 topic, and to --alert-webhook when given)")
    p.set_defaults(func=cmd_process)

    p = sub.add_parser("simulate", help="write simulated events as contract JSON lines",
                       description="Write telemetry.jsonl, inventory.jsonl and job.jsonl "
                       "(event contract v1, docs/events.md) for a simulated cluster.")
    sim_args(p)
    p.add_argument("--out", type=Path, required=True, help="output folder")
    common(p, warehouse=False)
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("ingest", help="process recorded JSON-lines events into a warehouse",
                       description="Decode, validate and process contract JSON-lines files "
                       "into the warehouse. Bad lines are reported (file:line: reason) and "
                       "kept in the rejects table; the rest goes through. Re-running on "
                       "the same files writes the same facts; files that start where the "
                       "previous ingest into the warehouse stopped continue it (jobs it "
                       "left running go on; docs/warehouse.md).")
    p.add_argument("files", nargs="+", type=Path, help="JSON-lines files (any mix of types)")
    common(p)
    p.add_argument("--strict", action="store_true",
                   help="exit with status 1 when any line was rejected: a bad line, or a "
                   "record the processor refused (a sample of a GPU no inventory knows, one "
                   "too far ahead; the rejects table has each)")
    p.add_argument("--show-rejects", type=whole_count("--show-rejects"), default=20, metavar="N",
                   help="print at most N rejected lines (default 20)")
    p.add_argument("--afresh", action="store_true",
                   help="process the files on their own, not going on from a saved state, "
                   "even where that replaces facts of their hours with theirs alone (an "
                   "input starting inside the ingested history with no state to go on "
                   "from is refused without it); the files' hours then lose the jobs and "
                   "nodes of the history before them: records older than the history's "
                   "end go in with the whole history again, in one run")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("import", help="import scheduler history (Slurm sacct, pod lists, "
                       "the openb trace)",
                       description="Import scheduler history into the warehouse through the "
                       "same processor. Formats: slurm-sacct (Slurm accounting, `sacct "
                       "--parsable2`), pods (a CSV pod list of any scheduler, with a column "
                       "mapping), openb (the Alibaba GPU cluster trace, ATC '23). "
                       "docs/import.md has each.")
    fmt = p.add_subparsers(dest="format", metavar="FORMAT", required=True)
    q = fmt.add_parser("openb", help="the Alibaba openb trace (node list + pod list CSV)",
                       description="Import the openb trace: nodes become inventory, GPU pods "
                       "become jobs placed by a documented best-fit policy (docs/import.md); "
                       "pods that cannot be placed are reported.")
    q.add_argument("--nodes", type=Path, required=True, help="openb_node_list_*.csv")
    q.add_argument("--pods", type=Path, required=True, help="openb_pod_list_*.csv")
    q.add_argument("--from-hours", type=non_negative("--from-hours"), default=0.0,
                   help="window start, hours after the trace start (default 0)")
    q.add_argument("--hours", type=positive(float, "--hours"), default=None,
                   help="window length in hours (default, or past the trace's end: to "
                   "the end of the trace)")
    q.add_argument("--start", type=_start_time, default=None,
                   help="wall-clock time of the trace's second 0 (default 2026-01-01T00:00Z)")
    common(q)
    add_replace(q)
    q.set_defaults(func=cmd_import_openb)
    for name in IMPORT_MODULES:
        importlib.import_module(name).register(fmt, common)

    p = sub.add_parser("query", help="run a read-only SQL query on the warehouse",
                       description="Run SELECT/EXPLAIN SQL (DuckDB dialect) on the warehouse "
                       "views: gpu_minute, gpu_hourly, gpu_daily, frag_minute, pending_minute, "
                       "blocked_minute, job_attempts, attempts, job_gpu, preemptions, "
                       "recommendations, utilisation_by_pool, utilisation_by_team, queue_wait, "
                       "fragmentation, borrowing, ... The connection is read-only and can "
                       "read nothing but the warehouse's facts (no other file, no network, no "
                       "extensions); anything that would write or change a setting is refused "
                       "with one line (docs/analyst-guide.md). Ctrl-C stops the query "
                       "(exit status 130).")
    p.add_argument("sql", help="the query ('-' reads it from standard input)")
    p.add_argument("--warehouse", default=None, metavar="PATH|s3://BUCKET/PREFIX",
                   help=READ_WAREHOUSE_HELP)
    p.add_argument("--format", choices=("table", "csv", "json"), default="table",
                   help="output format (default table). csv and json are written as the "
                   "rows come, in bounded memory; a table is sized from every row, so it "
                   "holds the whole result: use csv or json for big results")
    p.add_argument("--timeout", type=time_limit("--timeout"), default=300.0,
                   metavar="SECONDS", help="stop the query after this long (default 300; "
                   "'inf': no limit)")
    p.set_defaults(func=cmd_query)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub, common)
    return parser


def _command_parsers(parser: argparse.ArgumentParser) -> None:
    """Each (sub)command's parser kept in its namespace (``_parser``), so that an error
    found after parsing is told with that command's usage, not the top level's."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                child.set_defaults(_parser=child)
                _command_parsers(child)


def _parsed(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parse_args``, but words left over are refused by the command that was given
    (argparse has the top level say it, with the top level's usage), and SQL typed
    without quotes is told to be quoted."""
    _command_parsers(parser)
    args, extra = parser.parse_known_args(argv)
    if extra:
        where: argparse.ArgumentParser = getattr(args, "_parser", parser)
        hint = ""
        if args.command == "query" and not any(word.startswith("-") for word in extra):
            hint = ("; the SQL is one argument: quote it, e.g. gpuledger query "
                    "\"SELECT * FROM gpu_minute LIMIT 5\" (unquoted, the shell also "
                    "expands *)")
        where.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    return args


def _interrupted() -> int:
    """Ctrl-C: one line, exit 130; a second Ctrl-C while it is said is ignored (it
    interrupted the message: a second traceback, death by the signal)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print("gpuledger: interrupted", file=sys.stderr)
    return 130


def _duckdb_interrupted(exc: RuntimeError) -> bool:
    """Whether ``exc`` is DuckDB's answer to Ctrl-C during a query it ran on this thread:
    its Python binding raises a plain ``RuntimeError("Query interrupted")``, neither a
    ``duckdb.Error`` nor a ``KeyboardInterrupt`` (it gave a traceback, exit 1)."""
    return str(exc).strip().lower() == "query interrupted"


def main(argv: Sequence[str] | None = None) -> int:
    whole_writes.install()
    try:
        parser = build_parser()
        args = _parsed(parser, argv)
        if hasattr(args, "warehouse"):
            args.warehouse = warehouse_location(args.warehouse, getattr(args, "config", None))
        code: int = args.func(args)
        sys.stdout.flush()  # a full disk is said here, not at the interpreter's exit
        return code
    except CliError as exc:
        print(f"gpuledger: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return _interrupted()
    except RuntimeError as exc:
        if _duckdb_interrupted(exc):
            return _interrupted()
        raise
    except BrokenPipeError:  # the reader of the output has gone (| head): done, quietly
        _stdout_gone()
        return 0
    except OSError as exc:
        if exc.errno not in _OUTPUT_FULL:
            raise
        # the output's disk is full (> /dev/full, a quota): one line, not a traceback
        _stdout_gone()
        what = "the output" if exc.filename is None else exc.filename
        print(f"gpuledger: error: cannot write {what}: {exc.strerror}", file=sys.stderr)
        return 2


_OUTPUT_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EBADF})
"""Write errors told in one line wherever they come from (the output, or a file a
command writes that did not say so itself): a full disk, a quota, a file size limit,
standard output closed (``>&-``)."""


if __name__ == "__main__":
    sys.exit(main())
