"""``gpuledger feed``: registered through ``COMMAND_MODULES`` (no heavy imports here)."""

from __future__ import annotations

import argparse
import logging
import signal
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpuledger.cli.arguments import SIMULATED_HOURS_MAX, positive, whole_count
from gpuledger.cli.errors import CliError
from gpuledger.cli.kafka_errors import topics_created
from gpuledger.cli.log_setup import configure as configure_logging

log = logging.getLogger("gpuledger.feed")


def cmd_feed(args: argparse.Namespace) -> int:
    try:
        from gpuledger.pipeline.kafka.producer import KafkaSink
        from gpuledger.pipeline.kafka.settings import KafkaSettingsError, load_settings
        from gpuledger.pipeline.simulate import SimConfig, load_cluster
    except ImportError:
        raise CliError(
            "this command needs the pipeline extra: pip install 'gpuledger[pipeline]'"
        ) from None
    from gpuledger.pipeline.livefeed.episodes import Minute, episodes
    from gpuledger.pipeline.livefeed.pacing import feed

    configure_logging(logging.WARNING if args.quiet else logging.INFO)
    import os

    environ = dict(os.environ)
    if args.topic_prefix:
        environ["GPULEDGER_KAFKA_TOPIC_PREFIX"] = args.topic_prefix
    try:
        settings = load_settings(args.kafka, environ)
    except KafkaSettingsError as exc:
        raise CliError(f"kafka: {exc}") from None
    start = simulated_start(datetime.now(UTC), args.hours, args.speed)
    kw: dict[str, Any] = {"start": start, "hours": args.hours, "seed": args.seed,
                          "sample_interval_s": args.interval, "chunk_minutes": 1}
    if args.cluster is not None:
        try:
            kw["cluster"] = load_cluster(args.cluster)
        except ValueError as exc:  # ClusterSpecError: the file and the reason
            raise CliError(f"--cluster: {exc}") from None
    sim = SimConfig(**kw)
    topics_created(settings)
    stopping = [False]

    def on_term(_signum: int, _frame: Any) -> None:
        stopping[0] = True

    signal.signal(signal.SIGTERM, on_term)
    sink = KafkaSink(settings)
    log.info("feeding %g simulated hours%s from %s at %gx real time to %s", sim.hours,
             " and on (--loop)" if args.loop else "", start.isoformat(), args.speed,
             settings.bootstrap)

    def publish(minute: Minute) -> None:
        if minute.replayed:
            log.info("the first minute carries %d job events of the timeline before it "
                     "(the history an earlier run may have sent: duplicates count once)",
                     minute.replayed)
        sink.publish_batch(minute.batch)

    try:
        n = feed(episodes(sim, loop=args.loop), publish, chunk_s=60.0, speed=args.speed,
                 stop=lambda: stopping[0], not_before=lambda m: m.end.timestamp())
    except KeyboardInterrupt:
        n = -1
    finally:
        sink.close()
    print(f"published {max(n, 0):,} minute batches ({sink.messages:,} messages) "
          f"to {settings.bootstrap}")
    return 0


def simulated_start(now: datetime, hours: float, speed: float) -> datetime:
    """Where the simulated clock starts so that it never passes ``now``'s wall clock.

    At ``speed`` > 1 it gains ``hours × (1 − 1/speed)`` over the span, so it starts that
    far in the past (and ends at about the wall clock); one more minute back so that
    the first minute is complete at once, on a whole minute."""
    behind = timedelta(hours=hours) * max(0.0, 1.0 - 1.0 / speed)
    return (now - behind).replace(second=0, microsecond=0) - timedelta(minutes=1)


def register(subparsers: argparse._SubParsersAction,  # type: ignore[type-arg]
             common: Callable[..., None]) -> None:
    p = subparsers.add_parser(
        "feed", help="publish a simulated cluster to Kafka in real time (demo stacks)",
        description="Simulated node agents and scheduler: publish telemetry, inventory and "
        "job events of the simulated cluster to Kafka minute by minute as the (scaled) "
        "wall clock passes, so that a running processor, Prometheus and Grafana show a "
        "live cluster. The first minute goes out at once. The simulated timeline is "
        "anchored to the calendar, a UTC day per episode of the cluster (its seed and "
        "job ids from the day), so a restarted feed goes on with the same jobs; its "
        "first minute sends again the history of the jobs still open or ended in the "
        "last 23 hours, which ends those that ended while it was down (duplicates of "
        "what an earlier run sent count once; docs/deployment.md). "
        "No record is ever dated ahead of the wall clock: with --speed above 1 the "
        "simulated clock starts in the past (by --hours × (1 − 1/speed)) and reaches "
        "about now at the end; with --loop it then goes on in real time. Topics are "
        "created when missing; security from GPULEDGER_KAFKA_* variables "
        "(docs/kafka.md). SIGTERM stops after the current minute.")
    p.add_argument("--kafka", metavar="BOOTSTRAP", default=None,
                   help="HOST:PORT[,HOST:PORT] (default $GPULEDGER_KAFKA_BOOTSTRAP)")
    p.add_argument("--topic-prefix", default=None, help="prefix for the topic names")
    p.add_argument("--hours", type=positive(float, "--hours", at_most=SIMULATED_HOURS_MAX),
                   default=168.0,
                   help="simulated span in hours (default 168, a week; at most "
                   f"{SIMULATED_HOURS_MAX:,}); with --loop, how far back a --speed above 1 "
                   "starts")
    p.add_argument("--speed", type=positive(float, "--speed"), default=1.0,
                   help="simulated seconds per wall-clock second (default 1: real time); "
                   "never ahead of the wall clock: above 1 the simulated clock starts in "
                   "the past")
    p.add_argument("--loop", action="store_true",
                   help="do not stop after --hours: go on with new episodes forever "
                   "(in real time once the simulated clock has reached now)")
    p.add_argument("--interval", type=positive(int, "--interval"), default=10,
                   help="telemetry sample interval in seconds (default 10)")
    p.add_argument("--seed", type=whole_count("--seed"), default=7, help="random seed (default 7)")
    p.add_argument("--cluster", type=Path, default=None,
                   help="cluster spec YAML (default: the built-in 576-GPU cluster)")
    p.add_argument("--quiet", action="store_true", help="log only warnings")
    p.set_defaults(func=cmd_feed)
