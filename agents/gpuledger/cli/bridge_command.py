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
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from gpuledger.cli.arguments import positive
from gpuledger.cli.errors import CliError

# Modules of further bridges (``register(bridges, helpers)``), e.g. the Kubernetes one.
BRIDGE_MODULES: tuple[str, ...] = ("gpuledger.cli.bridge_kubernetes",)


def output_options(p: argparse.ArgumentParser, default_state: str) -> None:
    """Options every bridge shares: mapping, output (Kafka or a file), state, polling."""
    p.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="mapping file: scheduler names → team, pool, queue, priority, job "
                   "type, card type (docs/mapping.md); default: identity mapping")
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
    p.add_argument("--interval", type=positive(float, "--interval"), default=10.0,
                   metavar="SECONDS", help="seconds between polls (default 10)")
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


def open_sink(args: argparse.Namespace) -> Any:
    """The sink chosen by ``--kafka`` / ``--out``."""
    from gpuledger.bridges.output import FileSink, KafkaSpoolSink, kafka_producer_factory

    if args.out is not None:
        return FileSink(args.out)
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
    return KafkaSpoolSink(spool, kafka_producer_factory(settings), settings.topics.jobs,
                          settings.topics.inventory)


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

    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def cmd_bridge_slurm(args: argparse.Namespace) -> int:
    from gpuledger.bridges.slurm import SlurmBridge, SlurmSource
    from gpuledger.bridges.slurm_events import SlurmTracker
    from gpuledger.bridges.state import StateError

    _logging(args.quiet)
    tracker = SlurmTracker(mapping_of(args), job_id_prefix=args.job_id_prefix,
                           inventory_refresh_s=args.inventory_refresh)
    sink = open_sink(args)
    try:
        bridge = SlurmBridge(SlurmSource(fmt=args.format), tracker, sink, args.state)
    except StateError as exc:
        raise CliError(f"state: {exc}") from None
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
    print(f"slurm bridge: {t.polls} poll(s) ({t.failed_polls} failed), {t.events} job events, "
          f"{t.inventory} inventory records"
          + (f", {t.recovered} completed from an interrupted batch" if t.recovered else "")
          + (f"; {t.start_unseen} job(s) ran between polls (allocation not observed)"
             if t.start_unseen else "")
          + (f"; {t.before_bridge} job(s) had run before the first poll (not observed)"
             if t.before_bridge else "")
          + (f"; {t.requeue_unseen} requeue(s) of an attempt not seen running"
             if t.requeue_unseen else ""), file=sys.stderr)
    return 0


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
