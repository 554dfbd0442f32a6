"""``gpuledger feed``: registered through ``COMMAND_MODULES`` (no heavy imports here)."""

from __future__ import annotations

import argparse
import logging
import signal
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuledger.cli.arguments import positive
from gpuledger.cli.errors import CliError

log = logging.getLogger("gpuledger.feed")


def cmd_feed(args: argparse.Namespace) -> int:
    try:
        from gpuledger.pipeline.kafka.producer import KafkaSink
        from gpuledger.pipeline.kafka.settings import KafkaSettingsError, load_settings
        from gpuledger.pipeline.kafka.topics import create_topics
        from gpuledger.pipeline.simulate import SimConfig, load_cluster, simulate
    except ImportError:
        raise CliError(
            "this command needs the pipeline extra: pip install 'gpuledger[pipeline]'"
        ) from None
    from gpuledger.pipeline.livefeed.pacing import feed

    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import os

    environ = dict(os.environ)
    if args.topic_prefix:
        environ["GPULEDGER_KAFKA_TOPIC_PREFIX"] = args.topic_prefix
    try:
        settings = load_settings(args.kafka, environ)
    except KafkaSettingsError as exc:
        raise CliError(f"kafka: {exc}") from None
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    kw: dict[str, Any] = {"start": now, "hours": args.hours, "seed": args.seed,
                          "sample_interval_s": args.interval, "chunk_minutes": 1}
    if args.cluster is not None:
        try:
            kw["cluster"] = load_cluster(args.cluster)
        except (OSError, ValueError) as exc:
            raise CliError(f"--cluster: {exc}") from None
    sim = SimConfig(**kw)
    try:
        create_topics(settings)
    except Exception as exc:
        raise CliError(f"cannot create topics on {settings.bootstrap}: {exc}") from None
    stopping = [False]

    def on_term(_signum: int, _frame: Any) -> None:
        stopping[0] = True

    signal.signal(signal.SIGTERM, on_term)
    sink = KafkaSink(settings)
    log.info("feeding %g simulated hours from %s at %gx real time to %s", sim.hours,
             now.isoformat(), args.speed, settings.bootstrap)
    try:
        n = feed(simulate(sim), sink.publish_batch, chunk_s=60.0, speed=args.speed,
                 stop=lambda: stopping[0])
    except KeyboardInterrupt:
        n = -1
    finally:
        sink.close()
    print(f"published {max(n, 0):,} minute batches ({sink.messages:,} messages) "
          f"to {settings.bootstrap}")
    return 0


def register(subparsers: argparse._SubParsersAction,  # type: ignore[type-arg]
             common: Callable[..., None]) -> None:
    p = subparsers.add_parser(
        "feed", help="publish a simulated cluster to Kafka in real time (demo stacks)",
        description="Simulated node agents and scheduler: publish telemetry, inventory and "
        "job events of the simulated cluster to Kafka minute by minute as the (scaled) "
        "wall clock passes, starting now, so that a running processor, Prometheus and "
        "Grafana show a live cluster. Topics are created when missing; security from "
        "GPULEDGER_KAFKA_* variables (docs/kafka.md). SIGTERM stops after the current "
        "minute.")
    p.add_argument("--kafka", metavar="BOOTSTRAP", default=None,
                   help="HOST:PORT[,HOST:PORT] (default $GPULEDGER_KAFKA_BOOTSTRAP)")
    p.add_argument("--topic-prefix", default=None, help="prefix for the topic names")
    p.add_argument("--hours", type=positive(float, "--hours"), default=168.0,
                   help="simulated span in hours (default 168, a week)")
    p.add_argument("--speed", type=positive(float, "--speed"), default=1.0,
                   help="simulated seconds per wall-clock second (default 1: real time)")
    p.add_argument("--interval", type=positive(int, "--interval"), default=10,
                   help="telemetry sample interval in seconds (default 10)")
    p.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    p.add_argument("--cluster", type=Path, default=None,
                   help="cluster spec YAML (default: the built-in 576-GPU cluster)")
    p.add_argument("--quiet", action="store_true", help="log only warnings")
    p.set_defaults(func=cmd_feed)
