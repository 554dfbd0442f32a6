"""``gpuledger agent``: the node agent (docs/agent.md).

Lean: it imports only the agent (no Polars, DuckDB or PyArrow), except with the
simulator source, which needs the pipeline extra.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuledger.cli.errors import CliError
from gpuledger.cli.log_setup import configure as configure_logging


def register(sub: Any, common: Callable[..., None]) -> None:
    p = sub.add_parser(
        "agent", help="run the node agent (GPU telemetry + inventory → Kafka)",
        description="Collect GPU telemetry every interval from NVML, an existing "
        "dcgm-exporter or the simulator, attribute GPUs and processes to jobs (Slurm, "
        "Kubernetes, a mapping folder, static), and send samples and the node inventory "
        "to Kafka through a bounded on-disk spool that survives outages and restarts. "
        "Configuration: a YAML file, overridden by GPULEDGER_AGENT__SECTION__KEY "
        "variables; Kafka security from GPULEDGER_KAFKA_* (docs/agent.md). SIGTERM "
        "finishes the collection, delivers what it can and exits.")
    p.add_argument("--config", type=Path, default=None,
                   help="agent configuration YAML (every key optional; docs/agent.md)")
    p.add_argument("--once", action="store_true",
                   help="collect once, print the samples and the inventory as JSON and exit "
                   "(no Kafka, no spool): for troubleshooting")
    p.add_argument("--verbose", action="store_true", help="log at INFO level")
    p.set_defaults(func=cmd_agent)


def cmd_agent(args: argparse.Namespace) -> int:
    from gpuledger.agent.assemble import SourceError, build_chain, build_source
    from gpuledger.agent.config import AgentConfigError, load_agent_config
    from gpuledger.agent.run import Agent

    configure_logging(logging.INFO if args.verbose else logging.WARNING)
    try:
        config = load_agent_config(args.config)
    except AgentConfigError as exc:
        raise CliError(f"configuration: {exc}") from None
    if args.once:
        try:
            source = build_source(config)
        except SourceError as exc:
            raise CliError(str(exc)) from None
        agent = Agent(config, source, build_chain(config))
        try:
            return _once(agent)
        finally:
            agent.close()
    return _serve(config)


def _once(agent: Any) -> int:
    from gpuledger.agent.encode import ordered

    records = agent.collect()
    inventory = agent.inventory(records)
    out = {"telemetry": [ordered(r) for r in records],
           "inventory": ordered(inventory) if inventory else None}
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0 if agent.last_success else 1


def _serve(config: Any) -> int:
    from gpuledger.agent.assemble import SourceError, build_chain, build_source
    from gpuledger.agent.producer import kafka_settings, producer_factory
    from gpuledger.agent.run import Agent, SharedSpool
    from gpuledger.agent.sender import Sender
    from gpuledger.agent.spool import SpoolError
    from gpuledger.pipeline.kafka.settings import KafkaSettingsError

    try:
        settings = kafka_settings(config)
    except KafkaSettingsError as exc:
        raise CliError(f"kafka: {exc}") from None
    try:
        source = build_source(config)
    except SourceError as exc:
        raise CliError(str(exc)) from None
    created = _missing_folders(config.spool.path)
    try:
        spool = SharedSpool(config.spool.path, config.spool.max_bytes,
                            config.spool.segment_bytes)
    except SpoolError as exc:
        _close(source)
        raise CliError(f"spool.path: {exc}") from None
    except OSError as exc:
        _close(source)
        _remove_empty(created)
        raise CliError(f"spool.path: cannot use {config.spool.path}: "
                       f"{exc.strerror or exc}") from None
    sender = Sender(spool, producer_factory(settings, config.kafka.send_timeout_s),
                    batch=config.kafka.batch, send_timeout_s=config.kafka.send_timeout_s)
    agent = Agent(config, source, build_chain(config), spool, sender,
                  settings.topics.telemetry, settings.topics.inventory)
    server = None
    if config.metrics.listen:
        from gpuledger.agent.metrics import MetricsServer, registry_for

        host, _, port = config.metrics.listen.rpartition(":")
        try:
            server = MetricsServer(host or "0.0.0.0", int(port), registry_for(agent),
                                   agent.health)
        except OSError as exc:
            agent.close()
            _remove_empty(created)
            raise CliError(f"metrics.listen: cannot listen on {config.metrics.listen}: "
                           f"{exc.strerror or exc}") from None
        bound = host or "0.0.0.0"
        if ":" in bound and not bound.startswith("["):
            bound = f"[{bound}]"
        bound = f"{bound}:{server.port}"   # where it listens: the loopback or every interface
        logging.getLogger("gpuledger.agent").info("self-metrics on http://%s/metrics", bound)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        if stop.is_set():   # a second signal: no more waiting for Kafka
            logging.getLogger("gpuledger.agent").warning(
                "signal %d again: stopping without waiting for Kafka; what is spooled is "
                "sent at the next start", signum)
            agent.hurry()
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"gpuledger agent: node {agent.node}, source {config.source}, "
          f"kafka {settings.bootstrap} ({settings.topics.telemetry}), spool "
          f"{config.spool.path}" + (f", metrics {bound}" if server else ""),
          file=sys.stderr, flush=True)
    try:
        agent.run(stop)
    finally:
        if server is not None:
            server.close()
        agent.close()
    return 0


def _close(source: Any) -> None:
    close = getattr(source, "close", None)
    if close is not None:
        close()


def _missing_folders(path: Path) -> list[Path]:
    """``path`` and its parents that do not exist yet, deepest first."""
    missing: list[Path] = []
    for folder in (path, *path.parents):
        if folder.exists() or folder.is_symlink():
            break
        missing.append(folder)
    return missing


def _remove_empty(folders: list[Path]) -> None:
    """Undo the folders start-up created when it then fails (only while still empty)."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return
