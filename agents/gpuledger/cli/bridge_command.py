"""``gpuledger bridge SCHEDULER``: scheduler bridges (Slurm here; others register).

``bridge`` has one subcommand per scheduler. The Slurm bridge is defined here; other
bridges live in their own modules, listed in :data:`BRIDGE_MODULES`, each with
``register(bridges, helpers)`` where ``bridges`` is the ``bridge`` subparsers object
and ``helpers`` is this module (for :func:`output_options`, :func:`open_sink`,
:func:`mapping_of`), so every bridge has the same output options and exactly-once
hand-over. Lean: no Polars/DuckDB; Kafka output needs ``kafka-python``.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from gpuledger.cli.arguments import bounded, positive
from gpuledger.cli.errors import CliError

# Modules of further bridges (``register(bridges, helpers)``), e.g. the Kubernetes one.
BRIDGE_MODULES: tuple[str, ...] = ("gpuledger.cli.bridge_kubernetes",)


INTERVAL_MIN_S = 0.1
"""The shortest ``--interval``: each poll is two controller RPCs (a tenth of a second
already polls ten times a second; tests use 0.3 s, production 10 s or more)."""
INTERVAL_MAX_S = 86_400.0
"""The longest ``--interval``: a day."""


def poll_interval(name: str) -> Callable[[str], float]:
    """A finite number of seconds, at least :data:`INTERVAL_MIN_S` and at most a day
    (10¹⁸ overflowed the wait between polls: a traceback after the first poll)."""
    return bounded(float, name, at_least=INTERVAL_MIN_S, at_most=INTERVAL_MAX_S,
                   unit="seconds")


MAPPING_HELP = ("mapping file: scheduler names → team, pool, queue, priority, job type, "
                "card type (docs/mapping.md); default: identity mapping")


def output_options(p: argparse.ArgumentParser, default_state: str,
                   config_help: str = MAPPING_HELP, polls: bool = True) -> None:
    """Options every bridge shares: configuration, output (Kafka or a file), state,
    ``--interval`` (said to be unused by a bridge that watches: ``polls=False``)."""
    p.add_argument("--config", type=Path, default=None, metavar="FILE", help=config_help)
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--kafka", metavar="BOOTSTRAP",
                     help="send to Kafka (HOST:PORT[,...]; security from GPULEDGER_KAFKA_* "
                     "variables, docs/kafka.md): job events to the scheduler-events topic "
                     "keyed by job id, inventory to the inventory topic keyed by node")
    out.add_argument("--out", type=Path, metavar="FILE",
                     help="append contract JSON lines to FILE (for gpuledger ingest)")
    p.add_argument("--topic-prefix", default=None, help="prefix for the topic names")
    p.add_argument("--state", type=Path, default=Path(default_state), metavar="FILE",
                   help=f"state file: what was already sent (default {default_state})")
    p.add_argument("--spool", type=Path, default=None, metavar="DIR",
                   help="with --kafka: on-disk spool that holds records while Kafka is "
                   "unreachable (default: STATE.spool/)")
    p.add_argument("--interval", type=poll_interval("--interval"), default=10.0,
                   metavar="SECONDS",
                   help=f"seconds between polls, at least {INTERVAL_MIN_S:g} and at most "
                   f"{INTERVAL_MAX_S:,.0f} (default 10)" if polls else
                   "not used: this bridge watches instead of polling (accepted, so that "
                   "a command line written for the Slurm bridge still runs)")
    p.add_argument("--once", action="store_true", help="poll once, hand over, and exit")
    p.add_argument("--quiet", action="store_true", help="log only warnings")
    p.add_argument("--metrics-address", metavar="HOST:PORT", default=None,
                   help="serve the bridge's /metrics and /healthz here (e.g. "
                   "0.0.0.0:9467), so that Prometheus sees it down or gone "
                   "(docs/alerts.md); default: none")


def serve_metrics(args: argparse.Namespace, scheduler: str,
                  counters: Callable[[], dict[str, float]]) -> Any:
    """The bridge's metrics server for ``--metrics-address``, or None."""
    if not args.metrics_address:
        return None
    from gpuledger.bridges.metrics import serve

    try:
        server = serve(args.metrics_address, scheduler, counters)
    except (ValueError, OSError) as exc:
        raise CliError(f"--metrics-address: {exc}") from None
    print(f"serving http://{args.metrics_address}/metrics", file=sys.stderr, flush=True)
    return server


def mapping_of(args: argparse.Namespace) -> Any:
    from gpuledger.bridges.mapping import MappingError, load_mapping

    try:
        return load_mapping(args.config)
    except MappingError as exc:
        raise CliError(f"mapping: {exc}") from None


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _probe_folder(option: str, folder: Path, shown: Path) -> None:
    """Something can be created in the existing ``folder`` (tried, then removed)."""
    try:
        Path(tempfile.mkdtemp(prefix=".gpuledger-probe-", dir=folder)).rmdir()
    except OSError as exc:
        raise CliError(f"{option}: cannot create {shown}: {_reason(exc)}") from None


def _existing_ancestor(option: str, path: Path) -> Path:
    """The nearest folder above ``path`` that exists (it must be a folder)."""
    above = path.absolute().parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise CliError(f"{option}: cannot create {path}: {above} is not a directory")
    return above


def check_file_place(option: str, path: Path, shown: Path | None = None) -> None:
    """``path`` is a regular file that can be appended to, or can be created; nothing is
    created or changed. A :class:`CliError` naming ``option`` says why not."""
    shown = shown or path
    if path.is_dir():
        raise CliError(f"{option}: {path} is a directory")
    if path.exists():
        if not path.is_file():
            raise CliError(f"{option}: {path} is not a regular file")
        try:
            open(path, "ab").close()
        except OSError as exc:
            raise CliError(f"{option}: cannot write {path}: {_reason(exc)}") from None
        return
    _probe_folder(option, _existing_ancestor(option, path), shown)


def check_folder_place(option: str, path: Path) -> None:
    """``path`` is a folder that files can be created in, or can be created."""
    if path.exists():
        if not path.is_dir():
            raise CliError(f"{option}: {path} is not a directory")
        _probe_folder(option, path, path)
        return
    _probe_folder(option, _existing_ancestor(option, path), path)


def check_state(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--state`` file, read and checked, and its folder able to hold it and its
    ``.tmp``: before anything is created. The saved state (``{}`` when none)."""
    from gpuledger.bridges.state import StateError, load_state

    try:
        doc = load_state(args.state)
    except StateError as exc:
        raise CliError(f"--state {exc}") from None
    if getattr(args, "scheduler", None) == "kubernetes" and doc:
        from gpuledger.bridges.kubernetes.bridge import STATE_VERSION

        if doc.get("version") != STATE_VERSION:
            raise CliError(f"--state {args.state}: not a Kubernetes bridge state file "
                           f"(version {doc.get('version')!r})")
    check_file_place("--state", args.state.with_name(args.state.name + ".tmp"), args.state)
    return doc


def open_sink(args: argparse.Namespace) -> Any:
    """The sink chosen by ``--kafka`` / ``--out``, after checking ``--state`` and the
    output's place: a failure creates nothing."""
    from gpuledger.bridges.output import FileSink, KafkaSpoolSink, kafka_producer_factory

    check_state(args)
    if args.out is not None:
        check_file_place("--out", args.out)
        try:
            return FileSink(args.out)
        except OSError as exc:
            raise CliError(f"--out: cannot create {args.out}: {_reason(exc)}") from None
    try:
        import kafka  # noqa: F401
    except ImportError:
        raise CliError("--kafka needs kafka-python: pip install kafka-python") from None
    import os

    from gpuledger.pipeline.kafka.settings import KafkaSettingsError, load_settings

    environ = dict(os.environ)
    if args.topic_prefix:
        environ["GPULEDGER_KAFKA_TOPIC_PREFIX"] = args.topic_prefix
    try:
        settings = load_settings(args.kafka, environ)
    except KafkaSettingsError as exc:
        raise CliError(f"kafka: {exc}") from None
    spool = args.spool or args.state.with_name(args.state.name + ".spool")
    check_folder_place("--spool", spool)
    try:
        return KafkaSpoolSink(spool, kafka_producer_factory(settings), settings.topics.jobs,
                              settings.topics.inventory)
    except (OSError, ValueError) as exc:
        raise CliError(f"--spool: {spool}: {exc}") from None


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM/SIGINT: the bridge finishes its poll and exits."""
    stop = threading.Event()

    def handler(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def _logging(quiet: bool) -> None:
    import logging

    from gpuledger.cli.log_setup import configure

    configure(logging.WARNING if quiet else logging.INFO)


def cmd_bridge_slurm(args: argparse.Namespace) -> int:
    from gpuledger.bridges.slurm import SlurmBridge, SlurmSource, load_memory
    from gpuledger.bridges.slurm_events import SlurmTracker
    from gpuledger.bridges.state import StateError

    _logging(args.quiet)
    tracker = SlurmTracker(mapping_of(args), job_id_prefix=args.job_id_prefix,
                           inventory_refresh_s=args.inventory_refresh)
    try:
        load_memory(tracker, check_state(args), args.state)
    except StateError as exc:
        raise CliError(f"--state {exc}") from None
    sink = open_sink(args)
    try:
        bridge = SlurmBridge(SlurmSource(fmt=args.format), tracker, sink, args.state)
    except StateError as exc:
        raise CliError(f"--state {exc}") from None
    t = bridge.totals
    server = serve_metrics(args, "slurm", lambda: {
        "polls": t.polls, "failed_polls": t.failed_polls, "records": t.events + t.inventory})
    try:
        bridge.run(args.interval, stop_on_signals(), once=args.once)
    finally:
        if server is not None:
            server.close()
    if t.polls and t.failed_polls == t.polls:
        raise CliError("could not read Slurm (see the warnings above); is SLURM_CONF right "
                       "and the controller up?")
    unsent = unsent_records(sink)
    print(f"slurm bridge: {t.polls} poll(s) ({t.failed_polls} failed), {t.events} job events, "
          f"{t.inventory} inventory records"
          + (f", {t.recovered} completed from an interrupted batch" if t.recovered else "")
          + (f"; {t.start_unseen} job(s) ran between polls (allocation not observed)"
             if t.start_unseen else "")
          + (f"; {t.before_bridge} job(s) had run before the first poll (not observed)"
             if t.before_bridge else "")
          + (f"; {t.requeue_unseen} requeue(s) of an attempt not seen running"
             if t.requeue_unseen else "")
          + (f"; {unsent} record(s) spooled in {sink.spool.folder}, not sent to Kafka yet "
             "(the next run sends them)" if unsent else ""), file=sys.stderr)
    return 1 if args.once and unsent else 0


def unsent_records(sink: Any) -> int:
    """Records a Kafka sink still holds in its spool (0 for a file)."""
    spool = getattr(sink, "spool", None)
    return int(spool.backlog) if spool is not None else 0


def register(subparsers: Any, common: Any) -> None:
    del common  # bridges write no warehouse
    p = subparsers.add_parser(
        "bridge", help="scheduler bridges: turn a live scheduler into job events and inventory",
        description="Run a scheduler bridge: it polls or watches the scheduler and emits "
        "contract v1 job events (submitted, started with the GPU allocation, requeued, "
        "preempted, finished/failed/cancelled) and node inventory, to Kafka or to a "
        "JSON-lines file. A state file makes restarts lose and repeat nothing.")
    bridges = p.add_subparsers(dest="scheduler", metavar="SCHEDULER", required=True)
    q = bridges.add_parser(
        "slurm", help="poll a Slurm controller (squeue/sinfo/scontrol)",
        description="Poll Slurm (squeue --json and sinfo --json where the version has them, "
        "else scontrol's text) every --interval seconds, diff against the last poll and "
        "emit what changed; GPU indices come from GRES IDX. Runs wherever the Slurm client "
        "commands work (SLURM_CONF, munge). See docs/slurm.md.")
    output_options(q, "gpuledger-slurm-bridge.state")
    q.add_argument("--format", choices=("auto", "json", "text"), default="auto",
                   help="Slurm output to read (default auto: JSON when available)")
    q.add_argument("--job-id-prefix", default="", metavar="TEXT",
                   help="prefix for job ids (default none: Slurm's job id, as the node "
                   "agent's attribution reports it)")
    q.add_argument("--inventory-refresh", type=positive(float, "--inventory-refresh"),
                   default=300.0, metavar="SECONDS",
                   help="resend a node's unchanged inventory this often (default 300)")
    q.set_defaults(func=cmd_bridge_slurm)
    helpers = sys.modules[__name__]
    for name in BRIDGE_MODULES:
        importlib.import_module(name).register(bridges, helpers)
