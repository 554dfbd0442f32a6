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

PRODUCER_OPTIONS: dict[str, Any] = {"delivery_timeout_ms": 7 * 86_400_000,
                                    "max_block_ms": 7 * 86_400_000}
"""While the broker is away the producer keeps every message and retries: its default
delivery timeout (2 min) expired the queued minutes in silence (a probe: two minutes of
telemetry and four job events lost in a 170 s outage); a full buffer blocks the feed."""
UNCONFIRMED_S = 30.0
"""Nothing confirmed for this long, with messages waiting: the outage is said (once)."""
STOP_FLUSH_S = 20.0
"""At a stop, how long the messages still waiting may take (compose's grace is 30 s)."""
END_FLUSH_S = 600.0
"""At the end of the hours fed, how long they may take (an outage then)."""


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
    sink = KafkaSink(settings, **PRODUCER_OPTIONS)
    watch = DeliveryWatch(sink)
    log.info("feeding %g simulated hours%s from %s at %gx real time to %s", sim.hours,
             " and on (--loop)" if args.loop else "", start.isoformat(), args.speed,
             settings.bootstrap)

    def publish(minute: Minute) -> None:
        if minute.replayed:
            log.info("the first minute carries %d job events of the timeline before it "
                     "(the history an earlier run may have sent: duplicates count once)",
                     minute.replayed)
        _check_delivery(sink)
        sink.publish_batch(minute.batch)

    n = -1
    try:
        n = feed(episodes(sim, loop=args.loop), publish, chunk_s=60.0, speed=args.speed,
                 stop=lambda: stopping[0], not_before=lambda m: m.end.timestamp())
    except KeyboardInterrupt:
        pass
    finally:
        flushed = sink.close(STOP_FLUSH_S if stopping[0] or n < 0 else END_FLUSH_S)
        watch.stop()
    _check_delivery(sink)
    print(f"published {max(n, 0):,} minute batches ({sink.delivered:,} messages "
          f"confirmed) to {settings.bootstrap}")
    if not flushed:
        raise CliError(f"{sink.waiting:,} message(s) not confirmed by Kafka at "
                       f"{settings.bootstrap} at the end: they are lost (the broker is "
                       "unreachable)")
    return 0


def _check_delivery(sink: Any) -> None:
    """A message the broker refused for good stops the feed in one line (a restart
    policy then acts)."""
    if sink.failed:
        raise CliError(f"Kafka refused {sink.failed:,} message(s) ({sink.first_error}): "
                       "the feed stops")


class DeliveryWatch:
    """Says an outage once, and its end once: nothing confirmed for
    :data:`UNCONFIRMED_S` while messages wait or a send waits (for the broker's
    metadata, or room in a full buffer), then a confirmation again. A thread of its
    own: a send blocked on the broker holds the feed's thread."""

    def __init__(self, sink: Any, every_s: float = 0.5) -> None:
        import threading

        self.sink = sink
        self.every_s = every_s
        self._done = threading.Event()
        self._said = 0.0
        self._thread = threading.Thread(target=self._run, name="feed-delivery", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self.every_s):
            self._check()

    def _check(self) -> None:
        import time

        s, now = self.sink, time.monotonic()
        blocked = s.sending_since is not None and now - s.sending_since > UNCONFIRMED_S
        quiet = now - s.last_delivery > UNCONFIRMED_S
        if not self._said and quiet and (s.waiting or blocked):
            self._said = now
            log.warning("Kafka has confirmed nothing for %.0f s (%d message(s) waiting): "
                        "the feed holds them and waits, nothing is dropped; it says when "
                        "they are delivered", now - s.last_delivery, s.waiting)
        elif self._said and s.last_delivery > self._said:
            log.warning("Kafka confirms again after %.0f s: the messages held through the "
                        "outage are delivered", now - self._said)
            self._said = 0.0

    def stop(self) -> None:
        """End the watch; an end of the outage the last flush brought is said too (the
        thread, between two looks, missed it: a CI run said the outage and not its end)."""
        self._done.set()
        self._thread.join(timeout=2)
        if self._said:
            self._check()


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
        "(docs/kafka.md). Through a broker outage every message is held and sent "
        "when the broker is back (the outage and its end are said). SIGTERM stops after "
        "the current minute.")
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
